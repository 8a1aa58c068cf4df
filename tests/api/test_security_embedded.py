"""`make run` (service/embedded.py) as one unit: SIGTERM stops a running training within seconds
(the job goes back to the queue and resumes from its checkpoint on the next start), and a
SIGKILLed parent takes its worker, pool processes included, down with it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from service.auth import DEV_KEY
from tests.support.stack import REPO, auth_headers, child_pids, free_port, png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(data: Path, port: int, log: Path) -> subprocess.Popen:
    env = {
        k: v for k, v in os.environ.items() if k not in ("API_KEYS", "API_KEYS_FILE", "REDIS_URL")
    }
    env.update(
        DATA_DIR=str(data),
        PORT=str(port),
        TORCH_THREADS="1",
        CHECKPOINT_INTERVAL_S="0.5",
        PROGRESS_INTERVAL_S="0.2",
        BROKER_POLLING_INTERVAL_S="0.1",
    )
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.embedded"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(log.read_text())


def _statuses(data: Path, job_id: str) -> list[str]:
    """The job's logged statuses, read from the embedded SQLite database under `data`."""
    from core.storage import LocalStorage
    from core.store import JobStore

    store = JobStore(LocalStorage(data), url=f"sqlite:///{data.resolve()}/service.db")
    return [e["data"]["status"] for e in store.events(job_id) if e["event"] == "status"]


def _wait(pred, timeout: float, what: str, log: Path) -> float:
    t0 = time.monotonic()
    while not pred():
        assert time.monotonic() - t0 < timeout, (
            f"{what} not within {timeout} s\n{log.read_text()[-3000:]}"
        )
        time.sleep(0.1)
    return time.monotonic() - t0


def test_make_run_stops_trainings_and_dies_with_its_parent(tmp_path):
    data, port, log = tmp_path / "data", free_port(), tmp_path / "run.log"
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers=auth_headers(DEV_KEY), timeout=30
    )
    proc = _start(data, port, log)
    worker_pid = None
    try:
        r = client.post(
            "/v1/jobs",
            data={"kind": "image", "config": json.dumps({"steps": 200000, "resolution": 16})},
            files={"dataset": ("p.png", png_bytes(16, 16), "image/png")},
        )
        job_id = r.json()["id"]
        ckpts = data / "jobs" / job_id / "checkpoints"
        _wait(lambda: (ckpts / "latest").exists(), 60, "a checkpoint", log)

        # SIGTERM (Ctrl-C is the same path): training stops at its next step, job re-queued.
        worker_pid = int(re.findall(r"worker pid (\d+)", log.read_text())[-1])
        # The API runs with the dev key; its worker never sees it.
        environ = open(f"/proc/{worker_pid}/environ", "rb").read().split(b"\0")
        assert not [v for v in environ if v.startswith(b"API_KEYS")], "the worker got API_KEYS"
        proc.send_signal(signal.SIGTERM)
        took = _wait(lambda: _statuses(data, job_id)[-1] == "queued", 10, "training stop", log)
        assert took < 5
        assert _statuses(data, job_id)[-2:] == ["running", "queued"]
        # Celery's own warm shutdown (pool, timers) takes a few seconds more.
        _wait(lambda: proc.poll() is not None and not _alive(worker_pid), 30, "exit", log)
        step = int((ckpts / "latest").read_text())

        # Next start resumes it from the checkpoint; then the parent is SIGKILLed.
        proc = _start(data, port, log)
        _wait(lambda: _statuses(data, job_id)[-1] == "running", 60, "resume", log)
        _wait(lambda: int((ckpts / "latest").read_text()) > step, 60, "a newer checkpoint", log)
        worker_pid = int(re.findall(r"worker pid (\d+)", log.read_text())[-1])
        pool = child_pids(worker_pid)
        assert pool, "no pool process found"
        proc.kill()
        proc.wait()
        took = _wait(
            lambda: not any(_alive(p) for p in [worker_pid, *pool]),
            20,
            "the orphaned worker dying",
            log,
        )
        assert took < 15
    finally:
        for pid in [proc.pid] + ([worker_pid] if worker_pid else []):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()
