"""Read a compose file and run its services as local processes (no Docker engine needed).

The translation is the one a container would see, moved onto this machine:
- the image's WORKDIR (/app) is the repository root, and docker/bin/ (copied to /usr/local/bin
  in the images) comes first on PATH, then this interpreter's bin (the images' venv);
- a named volume `name:/path` is a folder `<tmp>/volumes/name`, and any environment value under
  `/path` is moved there; any other absolute path in an environment value is a path in the
  container's own file system, so it becomes `<tmp>/rootfs/<path>` (never this machine's /opt);
- `<service>:<container port>` in environment values (e.g. redis://redis:6379/0) and
  `127.0.0.1:<own port>` in healthchecks point at the free local port that stands for it;
- a bare environment key forwards this process's value when set, else leaves it unset, as
  Compose does;
- a service the test provides itself (`provided`: PostgreSQL as a database it created, MinIO as
  an S3-compatible server) stands in for that service: any URL in an environment value whose
  host is the service's name becomes the provided URL whole (`postgresql+psycopg://nf@postgres:
  5432/nf` -> the test's database).
Interpolation follows Compose: `$$`, `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`,
`${VAR:?error}`.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
IMAGE_WORKDIR = "/app"

_VAR = re.compile(
    r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(text: str, env: Mapping[str, str]) -> str:
    def sub(m: re.Match) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, default = m.group(3), m.group(4)
        value = env.get(name)
        if op == ":-" and not value:
            return default
        if op == "-" and value is None:
            return default
        if (op == ":?" and not value) or (op == "?" and value is None):
            raise KeyError(f"{name}: {default}")
        return value or ""

    return _VAR.sub(sub, text)


def _walk(obj: Any, env: Mapping[str, str]) -> Any:
    if isinstance(obj, str):
        return interpolate(obj, env)
    if isinstance(obj, list):
        return [_walk(v, env) for v in obj]
    if isinstance(obj, dict):
        return {k: _walk(v, env) for k, v in obj.items()}
    return obj


def load_compose(path: Path, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The file with YAML anchors/merges resolved and variables interpolated from `env`."""
    raw = yaml.safe_load(Path(path).read_text())
    return _walk(raw, os.environ if env is None else env)


def environment_of(service: Mapping[str, Any]) -> dict[str, str | None]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        out: dict[str, str | None] = {}
        for item in env:
            key, sep, value = item.partition("=")
            out[key] = value if sep else None
        return out
    return {k: (None if v is None else str(v)) for k, v in env.items()}


def argv_of(value: Any) -> list[str]:
    return list(map(str, value)) if isinstance(value, list) else shlex.split(str(value))


def healthcheck_argv(service: Mapping[str, Any]) -> list[str] | None:
    test = (service.get("healthcheck") or {}).get("test")
    if not test:
        return None
    if isinstance(test, str):
        return ["sh", "-c", test]
    kind, *rest = test
    if kind == "CMD":
        return list(map(str, rest))
    if kind == "CMD-SHELL":
        return ["sh", "-c", " ".join(map(str, rest))]
    return None


def container_ports(service: Mapping[str, Any]) -> list[int]:
    ports = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            ports.append(int(p["target"]))
        else:
            ports.append(int(str(p).split("/")[0].rsplit(":", 1)[-1]))
    return ports


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalService:
    name: str
    argv: list[str]
    env: dict[str, str]
    health_argv: list[str] | None
    log_path: Path
    stop_signal: str = "SIGTERM"
    stop_grace_s: float = 10.0
    proc: subprocess.Popen | None = None
    _log: Any = field(default=None, repr=False)
    _log_start: int = field(default=0, repr=False)  # where this run's lines begin in the log

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log_start = self._log.tell()
        self.proc = subprocess.Popen(
            self.argv,
            cwd=REPO,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        """As `docker compose stop`: the service's stop_signal, SIGKILL after stop_grace_period.
        Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(getattr(signal, self.stop_signal))
            try:
                self.proc.wait(self.stop_grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self._log:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def healthy(self, timeout: float = 60) -> bool:
        """Run the compose healthcheck once."""
        if not self.health_argv:
            return self.alive()
        try:
            r = subprocess.run(
                self.health_argv,
                cwd=REPO,
                env=self.env,
                timeout=timeout,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0

    def wait_healthy(self, deadline_s: float, after_line: str | None = None) -> None:
        """Until the compose healthcheck passes. With `after_line`, the healthcheck runs only
        once this run of the service has logged that line: a Celery worker's `inspect ping` sent
        before the worker listens is lost and waits out its whole --timeout (10 s) for nothing."""
        end = time.monotonic() + deadline_s
        while (
            after_line is not None
            and after_line.encode() not in (self.log_path.read_bytes()[self._log_start :])
        ):
            if not self.alive():
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}; log:\n{self.log()}"
                )
            if time.monotonic() > end:
                raise TimeoutError(f"{self.name} never logged {after_line!r}:\n{self.log()}")
            time.sleep(0.1)
        while time.monotonic() < end:
            if not self.alive():
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}; log:\n{self.log()}"
                )
            if self.healthy():
                return
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not healthy after {deadline_s}s; log:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except FileNotFoundError:
            return ""


class LocalTopology:
    """Translates compose services into LocalService objects; see the module docstring."""

    def __init__(
        self,
        compose: dict[str, Any],
        scratch: Path,
        ports: dict[str, int],
        base_env: Mapping[str, str] | None = None,
        provided: Mapping[str, str] | None = None,
        path: list[Path] | None = None,
    ):
        # ports: service name -> local port standing for its (single) listening container port.
        # provided: service name -> the URL of what stands for it (module docstring).
        # path: folders put first on the services' PATH (stand-ins for an image's tools).
        self.compose = compose
        self.scratch = Path(scratch)
        self.ports = ports
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.provided = dict(provided or {})
        self.path = [Path(p) for p in path or []]

    def volumes_of(self, name: str) -> dict[str, Path]:
        """Container path -> the local folder standing for that service's volume there."""
        return self._volume_map(self.compose["services"][name])

    def _volume_map(self, service: Mapping[str, Any]) -> dict[str, Path]:
        out = {}
        for v in service.get("volumes") or []:
            src, target = (
                (v["source"], v["target"]) if isinstance(v, dict) else str(v).split(":")[:2]
            )
            host = self.scratch / "volumes" / Path(src).name
            host.mkdir(parents=True, exist_ok=True)
            out[target] = host
        return out

    def _endpoints(self) -> dict[str, str]:
        """'<service>:<container port>' -> '127.0.0.1:<local port>'."""
        out = {}
        for name, port in self.ports.items():
            svc = self.compose["services"][name]
            for cport in container_ports(svc) or [_default_port(name, svc)]:
                out[f"{name}:{cport}"] = f"127.0.0.1:{port}"
        return out

    def _localise(self, text: str, volumes: dict[str, Path], own: dict[str, str]) -> str:
        for name, url in self.provided.items():
            text = re.sub(
                rf"\b[a-z][\w+.-]*://(?:[^@/\s\"']*@)?{re.escape(name)}(?![\w.-])(?::\d+)?(?:/[^\s\"']*)?",
                lambda _m, url=url: url,
                text,
            )
        for hostport, local in {**self._endpoints(), **own}.items():
            text = re.sub(rf"(?<![\w.-]){re.escape(hostport)}(?!\d)", local, text)
        for target, host in sorted(volumes.items(), key=lambda kv: -len(kv[0])):
            text = re.sub(rf"(?<![\w/]){re.escape(target)}(?=/|$|\s|')", str(host), text)
        return text

    def service(self, name: str) -> LocalService:
        svc = self.compose["services"][name]
        volumes = self._volume_map(svc)
        own: dict[str, str] = {}
        if name in self.ports:
            for cport in container_ports(svc):
                for host in ("127.0.0.1", "localhost", "0.0.0.0"):
                    own[f"{host}:{cport}"] = f"127.0.0.1:{self.ports[name]}"

        env = dict(self.base_env)
        for key, value in environment_of(svc).items():
            if value is None:
                continue  # bare key: forwarded from base_env when present there
            local = self._localise(value, volumes, own)
            if local == value and value.startswith("/") and not value.startswith(IMAGE_WORKDIR):
                local = str(self.scratch / "rootfs" / value.lstrip("/"))
                Path(local).mkdir(parents=True, exist_ok=True)
            env[key] = local
        bindirs = [
            *map(str, self.path),
            str(REPO / "docker" / "bin"),
            str(Path(sys.executable).parent),
        ]
        env["PATH"] = os.pathsep.join(bindirs + [env.get("PATH", "")])
        env["PYTHONUNBUFFERED"] = "1"

        command = argv_of(svc.get("entrypoint") or []) + argv_of(svc["command"])
        argv = [self._localise(a, volumes, own) for a in command]
        argv = _local_listen(argv, container_ports(svc), self.ports.get(name))
        health = healthcheck_argv(svc)
        if health:
            health = [self._localise(a, volumes, own) for a in health]
        return LocalService(
            name,
            argv,
            env,
            health,
            self.scratch / "logs" / f"{name}.log",
            stop_signal=str(svc.get("stop_signal", "SIGTERM")),
            stop_grace_s=_seconds(svc.get("stop_grace_period", "10s")),
        )


def _seconds(duration: str | int | float) -> float:
    """Compose durations: 30s, 1m30s, 2m, 500ms."""
    if isinstance(duration, (int, float)):
        return float(duration)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"bad duration {duration!r}")
    return sum(float(n) * units[u] for n, u in parts)


def _default_port(name: str, svc: Mapping[str, Any]) -> int:
    """The port a service listens on without a `ports:` entry (Redis: its --port or 6379)."""
    argv = argv_of(svc.get("command") or [])
    if "--port" in argv:
        return int(argv[argv.index("--port") + 1])
    if "redis" in str(svc.get("image", "")):
        return 6379
    raise ValueError(f"service {name}: no port known")


def _local_listen(argv: list[str], cports: list[int], local: int | None) -> list[str]:
    """`--port <container port>` -> the local port; `--host 0.0.0.0` -> loopback only."""
    out = list(argv)
    for i, a in enumerate(out[:-1]):
        if a == "--port" and local is not None and int(out[i + 1]) in cports:
            out[i + 1] = str(local)
        if a == "--host" and out[i + 1] == "0.0.0.0":
            out[i + 1] = "127.0.0.1"
    return out
