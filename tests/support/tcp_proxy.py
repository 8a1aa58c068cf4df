"""A TCP relay to a service on this host that a test can make stop relaying: what a proxy or a
load balancer that stopped forwarding looks like to a client (its connection stays open, its
bytes are accepted by the kernel and go nowhere, no answer ever comes).

    relay = Relay(("127.0.0.1", 5432))   # relay.port: connect here instead
    relay.pause()                        # from now on nothing passes either way
    relay.resume(); relay.close()
"""

from __future__ import annotations

import socket
import threading


class Relay:
    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True, name="tcp-relay").start()

    def pause(self) -> None:
        """Stop relaying (new connections are accepted and get no answer either)."""
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self._flowing.wait()  # a paused relay accepts, and connects upstream only later
            if self._closed:
                client.close()
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()
                if self._closed:
                    break
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
        self._flowing.set()
        self.sock.close()
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass
