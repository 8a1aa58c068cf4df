"""Poison and stranded trainings, on the real stack: a training whose process is SIGKILLed
MAX_WORKER_LOSSES times fails with "worker lost N times" instead of looping; with workers up,
a queued job whose message vanished and a running job whose whole worker died are sent again
by the periodic reaper; an upload folder a crashed API left behind is removed; a training whose
lease another host took stops."""

from __future__ import annotations

import os
import signal
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from core.db.engine import session
from core.db.jobs import JobRow
from core.db.leases import TRAIN, Lease
from tests.support.stack import child_pids, png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

LONG = {"steps": 200000, "resolution": 16}


def _starts(stack, job_id: str) -> int:
    """How many times training (re)started: `running` status events."""
    return sum(
        ev["event"] == "status" and ev["data"]["status"] == "running" for ev in stack.events(job_id)
    )


def _wait(pred, timeout: float, what: str, stack) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout} s\n{stack.logs()}"
        time.sleep(0.1)


def test_a_training_whose_worker_is_killed_three_times_fails(stack_factory):
    stack = stack_factory(queues="train", env={"PROGRESS_INTERVAL_S": "0.2"})
    job_id = stack.submit(png_bytes(16, 16), config=LONG).json()["id"]
    worker = stack.workers[0]
    for kill in range(1, 4):
        _wait(lambda k=kill: _starts(stack, job_id) >= k, 60, f"training start {kill}", stack)
        for pid in child_pids(worker.pid):
            os.kill(pid, signal.SIGKILL)
    job = stack.wait_status(job_id, "failed", timeout=60)
    assert "worker lost 3 times" in job["error"] and "MAX_WORKER_LOSSES" in job["error"]
    assert _starts(stack, job_id) == 3  # the fourth delivery did not train
    assert worker.poll() is None  # the worker itself is fine and takes new work
    other = stack.submit(png_bytes(16, 16), config={"steps": 20, "resolution": 16}).json()["id"]
    assert stack.wait_status(other, "succeeded", "failed")["status"] == "succeeded"


def test_stranded_jobs_are_sent_again_with_workers_up(stack_factory):
    env = {
        "REAPER_INTERVAL_S": "1",
        "QUEUED_GRACE_S": "2",
        "LEASE_TTL_S": "3",
        "STALE_UPLOAD_S": "5",
    }
    stack = stack_factory(queues="train", env=env)
    second = stack.start_worker("train")
    first = stack.workers[0]

    # A queued job whose message is lost while the workers are up (a Redis that lost its
    # queue, an API that died before sending): both workers are busy, the message is deleted.
    busy = [stack.submit(png_bytes(16, 16), config=LONG).json()["id"] for _ in range(2)]
    for b in busy:
        stack.wait_status(b, "running", timeout=60)
    lost = stack.submit(png_bytes(16, 16), config={"steps": 20, "resolution": 16}).json()["id"]
    queue_dir = stack.data_dir / "broker" / "queue"
    mine = [p for p in queue_dir.iterdir() if lost in p.read_text()]
    assert mine, "the queued job's message was not in the broker"
    for p in mine:
        p.unlink()

    # A running job whose whole worker dies, with no restart: its message is gone with it
    # (the filesystem broker removed it when the worker took it).
    victim = busy[0]
    log0 = (stack.log_dir / "worker-0.log").read_text()
    dead, alive = (first, second) if f"nf.train[{victim}]" in log0 else (second, first)
    os.killpg(dead.pid, signal.SIGKILL)
    dead.wait()
    stack.client.post(f"/v1/jobs/{busy[1]}/cancel")  # frees the surviving worker

    # An upload an API died in (its reserved row and folder), untouched for longer than
    # STALE_UPLOAD_S, and a fresh one.
    store = stack.store()
    old_id, fresh_id = str(uuid.uuid4()), str(uuid.uuid4())
    old, fresh = stack.job_dir(old_id), stack.job_dir(fresh_id)
    for job_id, folder in ((old_id, old), (fresh_id, fresh)):
        store.reserve(job_id, "k-someone")
        (folder / "upload").mkdir(parents=True)
        (folder / "upload" / "photo.png").write_bytes(b"x" * 100)
    with session(engine=store.engine) as s:
        s.execute(
            update(JobRow)
            .where(JobRow.id == old_id)
            .values(updated_at=datetime.now(UTC) - timedelta(seconds=60))
        )
    past = time.time() - 60
    for p in (old / "upload" / "photo.png", old / "upload", old):
        os.utime(p, (past, past))

    t0 = time.monotonic()
    # The idle folder goes at the next round; the fresh one (idle less than STALE_UPLOAD_S) stays.
    _wait(lambda: not old.exists(), 30, "the abandoned upload folder removed", stack)
    assert fresh.exists() and store.owner_of(fresh_id) and not store.owner_of(old_id)
    assert stack.wait_status(lost, "succeeded", "failed", timeout=60)["status"] == "succeeded"
    _wait(lambda: _starts(stack, victim) >= 2, 60, "the dead worker's job restarting", stack)
    took = time.monotonic() - t0
    assert took < 60
    assert alive.poll() is None
    stack.client.post(f"/v1/jobs/{victim}/cancel")
    stack.wait_status(victim, "cancelled", timeout=60)


def test_a_training_whose_lease_is_taken_over_stops_and_leaves_the_job_alone(stack_factory):
    """Another host took the train lease (this worker's renewals stalled past the TTL and the
    reaper sent the job again): the first worker stops at its next step, writes no status, and
    the job goes on with the new holder."""
    stack = stack_factory(queues="train", env={"PROGRESS_INTERVAL_S": "0.2", "LEASE_TTL_S": "2"})
    job_id = stack.submit(png_bytes(16, 16), config=LONG).json()["id"]
    stack.wait_status(job_id, "running", timeout=60)
    job = lambda: stack.client.get(f"/v1/jobs/{job_id}").json()  # noqa: E731
    _wait(lambda: (job().get("progress") or {}).get("step"), 60, "a step", stack)
    store = stack.store()
    with session(engine=store.engine) as s:
        s.execute(
            update(Lease)
            .where(Lease.kind == TRAIN, Lease.subject == job_id)
            .values(holder="other-host/boot/ns:4242:abc")
        )
    log = stack.log_dir / "worker-0.log"
    _wait(lambda: "train lease was lost" in log.read_text(), 30, "the worker stopping", stack)
    step = job()["progress"]["step"]
    time.sleep(1.0)
    after = job()
    assert after["status"] == "running" and after["progress"]["step"] == step  # no writes after
    other = stack.submit(png_bytes(16, 16), config={"steps": 20, "resolution": 16}).json()["id"]
    assert stack.wait_status(other, "succeeded", "failed")["status"] == "succeeded"
