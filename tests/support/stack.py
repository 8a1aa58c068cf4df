"""The real stack (uvicorn + Celery worker) as subprocesses, for tests and experiments.

Use from any test file (fixtures in tests/conftest.py):

    def test_x(stack_factory):
        stack = stack_factory()                     # filesystem broker, worker on train+render
        stack = stack_factory(redis_db=12)          # DB 12 of this process's Redis, flushed (skips if none)
        stack = stack_factory(queues=None)          # API only; stack.start_worker(...) later
        r = stack.client.post("/v1/jobs", files=..., data=...)   # sends the stack's API key
        job = stack.wait_status(job_id, "succeeded")

    def test_y(fs_stack): ...                       # one shared filesystem stack per test module

Every stack gets its own temp DATA_DIR (`stack.data_dir`), a free port (`stack.base_url`),
TORCH_THREADS=1, and is torn down by killing its process groups. Pass `env={...}` for
settings. Redis users: pick a DB number; each pytest process (xdist worker) has a private
redis-server (redis_port()), so only tests of one process, one at a time, share its DBs.
Process logs are in `stack.log_dir` and printed when a wait times out.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
# Every stack is configured with this API key (API_KEYS) and `stack.client` sends it; tests of
# other keys pass env={"API_KEYS": ...} and build their own clients with `auth_headers(token)`.
TEST_KEY = "test-key-0123456789"


def auth_headers(token: str = TEST_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


REDIS_HOST = "127.0.0.1"
# {"wanted": True} once use_private_redis() ran; then "port" (and "proc") once one was asked for.
_private_redis: dict[str, Any] = {}


def use_private_redis() -> None:
    """From now on redis_port() is a private redis-server of this process (tests/conftest.py
    asks for it in every pytest process, each xdist worker included)."""
    _private_redis["wanted"] = True


def redis_port() -> int:
    """The port of the Redis that DB numbers (redis_url_or_skip) live on.

    NF_TEST_REDIS_PORT names a server to use. Otherwise, after use_private_redis(), the process
    starts a private, unpersisted redis-server on a free port the first time one is asked for, so
    parallel xdist workers, other checkouts' runs and the machine's own server never flush or
    count each other's databases; it dies with the process (stop_private_redis, and
    PR_SET_PDEATHSIG where the process is killed). Else, or without redis-server on PATH, it is
    the local server at 6379 (experiments' --redis-db; tests skip where none answers)."""
    if os.environ.get("NF_TEST_REDIS_PORT"):
        return int(os.environ["NF_TEST_REDIS_PORT"])
    if not _private_redis.get("wanted"):
        return 6379
    if "port" not in _private_redis:
        _private_redis["port"] = _start_private_redis()
    return _private_redis["port"]


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the process that started it dies (PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _start_private_redis() -> int:
    import shutil
    import tempfile

    exe = shutil.which("redis-server")
    if exe is None:
        return 6379
    scratch = tempfile.mkdtemp(prefix="nf-test-redis-")
    for _ in range(5):  # a free port can be taken between the probe and the bind: try another
        port = free_port()
        proc = subprocess.Popen(
            [exe, "--port", str(port), "--bind", REDIS_HOST, "--save", "", "--appendonly", "no"]
            + ["--dir", scratch, "--databases", "16", "--logfile", ""],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with socket.create_connection((REDIS_HOST, port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        _private_redis["proc"] = proc
                        return port
            except OSError:
                time.sleep(0.05)
        proc.kill()
        proc.wait()
    return 6379


def stop_private_redis() -> None:
    proc = _private_redis.pop("proc", None)
    _private_redis.clear()
    if proc is not None:
        proc.kill()
        proc.wait()


def child_pids(pid: int) -> list[int]:
    """Pids whose parent is `pid` (read from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_url_or_skip(db: int) -> str:
    """A flushed Redis DB on the local server, or skip the test saying why."""
    import redis

    port = redis_port()
    url = f"redis://{REDIS_HOST}:{port}/{db}"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
        client.ping()
        client.flushdb()
    except Exception as exc:
        pytest.skip(f"no Redis answers at {REDIS_HOST}:{port} ({exc})")
    return url


def _stop(proc: subprocess.Popen, grace: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """Signal the process (uvicorn / Celery main shut down their own children), then SIGKILL
    whatever is left of its process group."""
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@dataclass
class Stack:
    data_dir: Path
    log_dir: Path
    env: dict[str, str]
    port: int
    api: subprocess.Popen | None = None
    workers: list[subprocess.Popen] = field(default_factory=list)
    _client: httpx.Client | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization header for the stack's first configured key."""
        first = (self.env.get("API_KEYS") or "").split(",")[0].strip()
        return auth_headers(first.split(":", 1)[-1]) if first else {}

    @property
    def client(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self.base_url, timeout=60, headers=self.headers)
        return self._client

    # -- processes ---------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        return subprocess.Popen(
            cmd,
            cwd=REPO,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def start_api(self, timeout: float = 30, ready_path: str = "/readyz") -> None:
        self.api = self._spawn(
            "api",
            [
                sys.executable,
                "-m",
                "uvicorn",
                "service.app:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.api.poll() is not None:
                raise RuntimeError(f"API exited with {self.api.returncode}\n{self.logs()}")
            try:
                if httpx.get(self.base_url + ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"API not ready after {timeout}s\n{self.logs()}")

    def stop_api(self) -> None:
        if self.api is not None:
            _stop(self.api)
            self.api = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def start_worker(
        self,
        queues: str = "train,render",
        concurrency: int = 1,
        wait: bool = True,
        timeout: float = 60,
        env: dict | None = None,
    ) -> subprocess.Popen:
        """A Celery worker on `queues`; `env` overrides the stack's settings for it alone (a
        DATA_DIR of its own: a host that shares no directory with the API)."""
        name = f"worker-{len(self.workers)}"
        # NF_FAKE_CUDA=1: the worker runs on the fake CUDA device (tests/support/fake_cuda.py).
        fake = {**self.env, **(env or {})}.get("NF_FAKE_CUDA", "") not in ("", "0")
        proc = self._spawn(
            name,
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.support.fake_cuda_app" if fake else "worker.app",
                "worker",
                "-Q",
                queues,
                "-c",
                str(concurrency),
                "-n",
                f"{name}-{uuid.uuid4().hex[:6]}@%h",
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "info",
            ],
            env,
        )
        self.workers.append(proc)
        if wait:
            log = self.log_dir / f"{name}.log"
            deadline = time.monotonic() + timeout
            while b" ready." not in log.read_bytes():
                if proc.poll() is not None:
                    raise RuntimeError(f"worker exited with {proc.returncode}\n{self.logs()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker not ready after {timeout}s\n{self.logs()}")
                time.sleep(0.1)
        return proc

    def stop(self) -> None:
        # Cold shutdown: an idle Celery worker takes seconds over a warm one (timers, pool).
        for w in self.workers:
            _stop(w, grace=1.0, sig=signal.SIGQUIT)
        self.stop_api()

    def logs(self, tail: int = 4000) -> str:
        out = []
        for p in sorted(self.log_dir.glob("*.log")):
            out.append(f"--- {p.name} ---\n{p.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)

    # -- helpers -----------------------------------------------------------------------
    def job_dir(self, job_id: str) -> Path:
        return self.data_dir / "jobs" / job_id

    @property
    def database_url(self) -> str:
        data_dir = Path(self.env.get("DATA_DIR") or self.data_dir).resolve()
        return self.env.get("DATABASE_URL") or f"sqlite:///{data_dir}/service.db"

    def store(self):
        """A JobStore on the stack's database (what the API and its workers write)."""
        from core.storage import LocalStorage
        from core.store import JobStore

        return JobStore(
            LocalStorage(self.env.get("DATA_DIR") or self.data_dir), url=self.database_url
        )

    def events(self, job_id: str) -> list[dict[str, Any]]:
        """The job's logged events, oldest first: {"id", "event", "data"}."""
        return self.store().events(job_id)

    def job_dirs(self) -> list[Path]:
        jobs = self.data_dir / "jobs"
        return sorted(jobs.iterdir()) if jobs.is_dir() else []

    def submit(
        self,
        data: bytes,
        filename: str = "photo.png",
        kind: str = "image",
        config: dict[str, Any] | str | None = None,
        content_type: str = "application/octet-stream",
    ):
        import json

        form = {"kind": kind}
        if config is not None:
            form["config"] = config if isinstance(config, str) else json.dumps(config)
        return self.client.post(
            "/v1/jobs", data=form, files={"dataset": (filename, data, content_type)}
        )

    def wait_for(self, job_id: str, pred, timeout: float = 120, what: str = "condition") -> dict:
        deadline = time.monotonic() + timeout
        job = None
        while time.monotonic() < deadline:
            r = self.client.get(f"/v1/jobs/{job_id}")
            r.raise_for_status()
            job = r.json()
            if pred(job):
                return job
            time.sleep(0.1)
        raise TimeoutError(f"{what} not reached in {timeout}s; last job state {job}\n{self.logs()}")

    def wait_status(self, job_id: str, *statuses: str, timeout: float = 120) -> dict:
        return self.wait_for(
            job_id, lambda j: j["status"] in statuses, timeout, f"status in {statuses}"
        )


def new_stack(
    root: Path,
    queues: str | None = "train,render",
    redis_db: int | None = None,
    env: dict | None = None,
    concurrency: int = 1,
) -> Stack:
    """A started stack (API, plus a worker on `queues` unless None) with its DATA_DIR and logs
    under `root`; the caller stops it. Tests use the fixtures; experiments call this directly."""
    data_dir, log_dir = root / "data", root / "logs"
    data_dir.mkdir(parents=True)
    log_dir.mkdir()
    full_env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    full_env.update(
        {
            "DATA_DIR": str(data_dir),
            "TORCH_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            "BROKER_POLLING_INTERVAL_S": "0.1",
            "API_KEYS": f"test:{TEST_KEY}",
            # Test modules share one key and submit freely; quota tests set their own.
            "QUOTA_ACTIVE_JOBS": "1000",
            "QUOTA_JOBS_PER_HOUR": "100000",
        }
    )
    full_env.pop("API_KEYS_FILE", None)
    if redis_db is not None:
        full_env["REDIS_URL"] = redis_url_or_skip(redis_db)
    full_env.update(env or {})
    stack = Stack(data_dir=data_dir, log_dir=log_dir, env=full_env, port=free_port())
    try:
        stack.start_api()
        if queues:
            stack.start_worker(queues, concurrency=concurrency)
    except BaseException:
        stack.stop()
        raise
    return stack


@contextmanager
def stack_maker(tmp_path_factory) -> Iterator:
    """Yields make(queues="train,render" | None, redis_db=None, env=None, concurrency=1) -> Stack;
    every stack made is stopped on exit."""
    stacks: list[Stack] = []

    def make(
        queues: str | None = "train,render",
        redis_db: int | None = None,
        env: dict | None = None,
        concurrency: int = 1,
    ) -> Stack:
        stack = new_stack(tmp_path_factory.mktemp("stack"), queues, redis_db, env, concurrency)
        stacks.append(stack)
        return stack

    try:
        yield make
    finally:
        for s in stacks:
            s.stop()


# -- test data -------------------------------------------------------------------------------
def png_bytes(width: int = 48, height: int = 40, seed: int = 0) -> bytes:
    """A small photo-like PNG: a scikit-image photo crop when available, else smooth noise."""
    import numpy as np
    from PIL import Image

    try:
        from skimage import data as skdata

        img = Image.fromarray(skdata.astronaut()).resize((width, height), Image.Resampling.LANCZOS)
    except Exception:
        rng = np.random.default_rng(seed)
        img = Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8"))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()
