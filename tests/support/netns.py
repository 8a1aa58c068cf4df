"""Separate hosts for tests: Linux network namespaces joined to this one by veth pairs.

A process started in a `Host` (`host.popen([...])`) has its own loopback and one address,
`host.addr`, on a point-to-point link whose other end, `host.gateway`, is this (the test's)
namespace. Services that listen only on 127.0.0.1 here (PostgreSQL, Redis, an S3 server) are
offered on the gateway address by `Forwarder`, a TCP relay, so a host reaches them the way a
worker host reaches a database server: by an address, not a shared socket or file.

Needs root (CAP_NET_ADMIN) and `ip`; `netns_or_skip()` says why when they are missing.
"""

from __future__ import annotations

import fcntl
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

_SUBNET = "10.231"
_link_lock = threading.Lock()
# Held across processes (xdist workers, other test runs) from reading the addresses in use to
# adding the chosen one, so two hosts made at once never pick the same /30.
_LINK_LOCK_FILE = Path(tempfile.gettempdir()) / "nf-test-netns-links.lock"


@contextmanager
def _links_locked() -> Iterator[None]:
    with _link_lock, open(_LINK_LOCK_FILE, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def netns_or_skip() -> None:
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) is not installed")
    probe = f"nf-probe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"cannot create network namespaces here: {exc}")
    _ip("netns", "del", probe)


class Host:
    """A network namespace with a veth link to this namespace (gateway) and its own loopback."""

    def __init__(self, name: str):
        suffix = uuid.uuid4().hex[:6]
        self.name = f"nf-{name}-{suffix}"
        outer, inner = f"nfo{suffix}", f"nfi{suffix}"
        _ip("netns", "add", self.name)
        try:
            with _links_locked():
                # A /30 no other link here uses (another test run may hold some at once).
                used = subprocess.run(
                    ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True
                ).stdout
                link = next(n for n in range(1, 255) if f" {_SUBNET}.{n}.1/" not in used)
                self.gateway = f"{_SUBNET}.{link}.1"
                self.addr = f"{_SUBNET}.{link}.2"
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", self.name)
                _ip("addr", "add", f"{self.gateway}/30", "dev", outer)
            _ip("link", "set", outer, "up")
            self._in("ip", "addr", "add", f"{self.addr}/30", "dev", inner)
            self._in("ip", "link", "set", inner, "up")
            self._in("ip", "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def _in(self, *argv: str) -> None:
        subprocess.run(
            ["ip", "netns", "exec", self.name, *argv], check=True, capture_output=True, text=True
        )

    def argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host."""
        return ["ip", "netns", "exec", self.name, *argv]

    def close(self) -> None:
        # Deleting the namespace removes its veth end, which removes the pair.
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


class Forwarder:
    """Relays TCP connections from (listen_host, listen_port) to (target_host, target_port)."""

    def __init__(self, listen_host: str, listen_port: int, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.sock = socket.create_server((listen_host, listen_port), reuse_port=False)
        self.address = self.sock.getsockname()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="netns-forwarder").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        self.sock.close()
