"""Faults the service must survive without losing work: the API restarted mid-training, Redis
restarted (a scratch server on its own port, without persistence, so its queue is really lost),
storage that stops taking writes, and a checkpoint torn by a crash."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.stack import free_port, png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out


def _pool_children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def _latest(job_dir: Path) -> int | None:
    try:
        return int((job_dir / "checkpoints" / "latest").read_text())
    except (OSError, ValueError):
        return None


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached in {timeout} s")


def test_api_restart_mid_training_loses_nothing(stack_factory):
    stack = stack_factory(env={"CHECKPOINT_INTERVAL_S": "0.5"})
    job_id = stack.submit(png_bytes(24, 16), config={"steps": 1500, "resolution": 16}).json()["id"]
    before = stack.wait_for(
        job_id, lambda j: j["status"] == "running" and j["progress"]["step"] > 50
    )
    stack.stop_api()
    time.sleep(1.0)  # training goes on with no API at all
    stack.start_api()
    during = stack.client.get(f"/v1/jobs/{job_id}").json()
    assert (
        during["status"] in ("running", "succeeded")
        and during["progress"]["step"] > before["progress"]["step"]
    )
    assert stack.client.get("/v1/jobs").json()["total"] == 1
    done = stack.wait_status(job_id, "succeeded", "failed")
    assert done["status"] == "succeeded", done
    # One training from start to end: no restart (a second `running`), ids without gaps.
    evs = stack.events(job_id)
    assert [e["id"] for e in evs] == list(range(1, len(evs) + 1))
    assert [e["data"]["status"] for e in evs if e["event"] == "status"] == [
        "queued",
        "running",
        "succeeded",
    ]
    assert stack.client.get(f"/v1/jobs/{job_id}/artifacts/reconstruction.png").status_code == 200
    assert stack.client.get(f"/v1/jobs/{job_id}/checkpoint").status_code == 200


class ScratchRedis:
    """A throwaway redis-server with no persistence: a restart empties it, like a lost node."""

    def __init__(self, tmp: Path):
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server not installed")
        self.port, self.tmp, self.proc = free_port(), tmp, None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        import redis

        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5)
        _wait(lambda: self._ping(client), 10, "scratch redis up")

    @staticmethod
    def _ping(client) -> bool:
        try:
            return bool(client.ping())
        except Exception:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def test_redis_restart_loses_no_queued_job(stack_factory, tmp_path):
    redis_server = ScratchRedis(tmp_path)
    redis_server.start()
    try:
        stack = stack_factory(queues=None, env={"REDIS_URL": redis_server.url})
        ids = [
            stack.submit(png_bytes(16, 16, seed=i), config={"steps": 20, "resolution": 16}).json()[
                "id"
            ]
            for i in range(2)
        ]
        import redis

        assert (
            redis.Redis.from_url(redis_server.url).llen("train") == 2
        )  # the two messages, in Redis only
        # /readyz answers from a check at most READY_CACHE_S old, so each state shows within it.
        redis_server.kill()
        _wait(lambda: stack.client.get("/readyz").status_code == 503, 5, "/readyz 503")
        redis_server.start()  # same port, empty: both messages are gone
        assert redis.Redis.from_url(redis_server.url).llen("train") == 0
        _wait(lambda: stack.client.get("/readyz").status_code == 200, 5, "/readyz 200")
        assert all(stack.client.get(f"/v1/jobs/{i}").json()["status"] == "queued" for i in ids)
        # A job submitted after the restart goes through the new server as usual.
        ids.append(
            stack.submit(png_bytes(16, 16, seed=9), config={"steps": 20, "resolution": 16}).json()[
                "id"
            ]
        )

        stack.start_worker()
        for job_id in ids:
            assert (
                stack.wait_status(job_id, "succeeded", "failed", timeout=120)["status"]
                == "succeeded"
            )
        log = (stack.log_dir / "worker-0.log").read_text()
        assert "re-sent" in log and all(i in log for i in ids[:2])
        # Each trained exactly once, although the third one was both in Redis and re-sent.
        for job_id in ids:
            runs = [e for e in stack.events(job_id) if e["event"] == "status"]
            assert [e["data"]["status"] for e in runs] == ["queued", "running", "succeeded"], runs
    finally:
        redis_server.kill()


def test_storage_that_stops_taking_writes_fails_the_job_readably(stack_factory, pg_url):
    """RLIMIT_FSIZE on the training process: every write past 100 kB fails with EFBIG, as on a
    full disk. Checkpoints (~0.6 MB) cannot be written; the job's state, in a PostgreSQL server
    (an SQLite file would be the process's own write, past the limit too), still can."""
    stack = stack_factory(
        queues=None,
        env={
            "CHECKPOINT_INTERVAL_S": "0.5",
            "PROGRESS_INTERVAL_S": "0.5",
            "DATABASE_URL": pg_url,
        },
    )
    job_id = stack.submit(png_bytes(24, 16), config={"steps": 200000, "resolution": 16}).json()[
        "id"
    ]
    worker = stack.start_worker("train")
    job_dir = stack.job_dir(job_id)
    first = _wait(lambda: _latest(job_dir), 60, "a first checkpoint")
    size = (job_dir / "checkpoints" / f"step-{first}.safetensors").stat().st_size
    assert size > 200_000
    limit = 100_000
    for pid in _pool_children(worker.pid):
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))
    kept = {
        p.name: p.read_bytes()
        for p in (job_dir / "checkpoints").iterdir()
        if p.suffix == ".safetensors"
    }

    failed = stack.wait_status(job_id, "failed", "succeeded", timeout=60)
    assert failed["status"] == "failed"
    assert failed["error"].startswith("OSError") and os.strerror(errno.EFBIG) in failed["error"], (
        failed["error"]
    )
    # What was saved before stays whole and loadable; no temp files or half files are left.
    ckdir = job_dir / "checkpoints"
    from worker.checkpoints import CheckpointManager

    survivors = {p.name: p.read_bytes() for p in ckdir.iterdir() if p.suffix == ".safetensors"}
    assert survivors and all(kept.get(name) == data for name, data in survivors.items())
    assert not [p for p in ckdir.iterdir() if p.name.endswith(".tmp")]
    ck = CheckpointManager(ckdir).load_latest()
    assert ck is not None and f"step-{ck.step}.safetensors" in survivors and ck.tensors
    status_events = [e["data"] for e in stack.events(job_id) if e["event"] == "status"]
    assert status_events[-1]["status"] == "failed" and status_events[-1]["error"] == failed["error"]


def test_a_truncated_checkpoint_is_never_loaded(stack_factory):
    """Crash mid-write: the whole worker dies and the newest checkpoint file is cut short. The
    restart resumes from the one before, renders skip it, and the download offers the previous."""
    stack = stack_factory(
        queues=None, env={"CHECKPOINT_INTERVAL_S": "0.3", "CHECKPOINTS_KEPT": "3"}
    )
    # Long enough that "two checkpoints, not past 60 %" lasts seconds, not one 0.3 s interval
    # (~1000 steps/s here): a poll that a loaded machine delays by that much must still see it.
    steps = 4000
    job_id = stack.submit(png_bytes(24, 16), config={"steps": steps, "resolution": 16}).json()["id"]
    worker = stack.start_worker()
    job_dir = stack.job_dir(job_id)
    ckdir = job_dir / "checkpoints"
    _wait(
        lambda: (
            len(list(ckdir.glob("*.safetensors"))) >= 2 and (_latest(job_dir) or 0) < steps * 0.6
        ),
        60,
        "two checkpoints",
    )
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    torn = _latest(job_dir)
    older = sorted(
        int(p.stem.split("-")[1])
        for p in ckdir.glob("step-*.safetensors")
        if p.stem != f"step-{torn}"
    )
    path = ckdir / f"step-{torn}.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    n = len(stack.events(job_id))

    stack.start_worker()
    done = stack.wait_status(job_id, "succeeded", "failed", timeout=120)
    assert done["status"] == "succeeded", done
    rerun = [e["data"]["step"] for e in stack.events(job_id)[n:] if e["event"] == "progress"]
    assert rerun[0] == older[-1], (
        torn,
        older,
        rerun[:3],
    )  # the previous checkpoint, not the torn one

    # After training: tear the final checkpoint too. Renders and the download use the one before.
    final = _latest(job_dir)
    last = ckdir / f"step-{final}.safetensors"
    last.write_bytes(last.read_bytes()[:1000])
    r = stack.client.get(f"/v1/jobs/{job_id}/checkpoint")
    assert r.status_code == 200 and int(r.headers["x-checkpoint-step"]) < final
    from tempfile import NamedTemporaryFile

    from safetensors import safe_open

    with NamedTemporaryFile(suffix=".safetensors") as fh:
        fh.write(r.content)
        fh.flush()
        with safe_open(fh.name, "pt") as f:
            assert f.keys() and json.loads(f.metadata()["nf_meta"])["step"] == int(
                r.headers["x-checkpoint-step"]
            )
    r = stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": 12, "height": 8})
    assert r.status_code == 200 and r.content[:4] == b"\x89PNG"
