"""Listing, cancelling (queued and running), failing and crash-resuming jobs, with a real worker."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.support.stack import png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

LONG = {"steps": 100_000, "resolution": 16}


def _events(stack, job_id):
    return stack.events(job_id)


def test_list_is_newest_first_and_paginated(stack_factory):
    stack = stack_factory(queues=None)
    ids = [stack.submit(png_bytes(16, 16)).json()["id"] for _ in range(3)]
    page = stack.client.get("/v1/jobs", params={"limit": 2}).json()
    assert page["total"] == 3 and [j["id"] for j in page["items"]] == ids[::-1][:2]
    rest = stack.client.get("/v1/jobs", params={"limit": 2, "offset": 2}).json()
    assert [j["id"] for j in rest["items"]] == ids[:1]
    assert stack.client.get("/v1/jobs", params={"status": "running"}).json()["total"] == 0
    assert stack.client.get("/v1/jobs", params={"limit": 0}).status_code == 422


@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_cancel_queued_then_running(stack_factory, broker):
    stack = stack_factory(queues=None, redis_db=11 if broker == "redis" else None)
    queued = stack.submit(png_bytes(16, 16), config={"steps": 50, "resolution": 16}).json()["id"]
    r = stack.client.post(f"/v1/jobs/{queued}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert stack.client.post(f"/v1/jobs/{queued}/cancel").status_code == 409

    # A worker arriving later skips the cancelled job and trains the next one.
    running = stack.submit(png_bytes(16, 16), config=LONG).json()["id"]
    stack.start_worker()
    stack.wait_for(running, lambda j: j["progress"]["step"] > 0, what="training started")
    t0 = time.monotonic()
    assert stack.client.post(f"/v1/jobs/{running}/cancel").status_code == 200
    done = stack.wait_status(running, "cancelled", "failed", "succeeded", timeout=20)
    assert done["status"] == "cancelled" and time.monotonic() - t0 < 10
    assert done["progress"]["step"] < LONG["steps"]

    assert stack.client.get(f"/v1/jobs/{queued}").json()["status"] == "cancelled"
    assert not (stack.job_dir(queued) / "checkpoints").exists()
    assert [e["data"]["status"] for e in _events(stack, queued) if e["event"] == "status"] == [
        "queued",
        "cancelled",
    ]
    # The worker is free again afterwards.
    ok = stack.submit(png_bytes(16, 16), config={"steps": 20, "resolution": 16}).json()["id"]
    assert stack.wait_status(ok, "succeeded", "failed")["status"] == "succeeded"


def test_failing_job_reports_a_readable_error(stack_factory):
    stack = stack_factory(queues=None)
    job_id = stack.submit(png_bytes(16, 16), config={"steps": 20}).json()["id"]
    # The dataset vanishes between intake and training (a lost volume, say).
    for f in (stack.job_dir(job_id) / "dataset").iterdir():
        f.unlink()
    stack.start_worker()
    job = stack.wait_status(job_id, "failed", "succeeded")
    assert job["status"] == "failed"
    assert job["error"].startswith("FileNotFoundError") and "no image" in job["error"]
    assert (
        stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": 8, "height": 8}).status_code
        == 409
    )


def test_killed_worker_process_resumes_from_checkpoint(stack_factory):
    stack = stack_factory(queues=None, env={"CHECKPOINT_INTERVAL_S": "0.3"})
    steps = 1500
    job_id = stack.submit(png_bytes(16, 16), config={"steps": steps, "resolution": 16}).json()["id"]
    worker = stack.start_worker()
    stack.wait_for(job_id, lambda j: j["progress"]["step"] > 200, what="some training")
    ckpts = stack.job_dir(job_id) / "checkpoints"
    deadline = time.monotonic() + 20
    while not (ckpts / "latest").exists():
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.05)

    # SIGKILL the pool process doing the training; acks_late + reject_on_worker_lost requeue it.
    child = int(subprocess.check_output(["pgrep", "-P", str(worker.pid)]).split()[0])
    os.kill(child, signal.SIGKILL)
    _assert_resumed(stack, job_id, ckpts)


def _assert_resumed(stack, job_id, ckpts):
    """After a kill: the job succeeds, and the rerun (its second `running` event) started at a
    checkpoint, not at step 0."""
    done = stack.wait_status(job_id, "succeeded", "failed", timeout=180)
    assert done["status"] == "succeeded", done
    events = _events(stack, job_id)
    starts = [
        i
        for i, e in enumerate(events)
        if e["event"] == "status" and e["data"]["status"] == "running"
    ]
    assert len(starts) == 2, [
        (e["event"], e["data"].get("status")) for e in events if e["event"] == "status"
    ]
    first = [e["data"]["step"] for e in events[starts[0] : starts[1]] if e["event"] == "progress"]
    rerun = [e["data"]["step"] for e in events[starts[1] :] if e["event"] == "progress"]
    # The rerun's first report is the step it resumed at: a checkpoint, so neither 0 nor the end.
    assert first and 0 < rerun[0] < done["progress"]["total_steps"], (first[-3:], rerun[:3])
    assert rerun == sorted(rerun) and rerun[-1] == done["progress"]["total_steps"]


def test_training_orphaned_by_a_killed_worker_resumes_when_a_worker_starts(stack_factory):
    # The whole worker (main process too) dies: the filesystem broker never sees the task
    # fail, so only the restarted worker's orphan check can bring the job back.
    stack = stack_factory(queues=None, env={"CHECKPOINT_INTERVAL_S": "0.3"})
    steps = 1500
    job_id = stack.submit(png_bytes(16, 16), config={"steps": steps, "resolution": 16}).json()["id"]
    worker = stack.start_worker()
    stack.wait_for(job_id, lambda j: j["progress"]["step"] > 200, what="some training")
    deadline = time.monotonic() + 20
    while not (stack.job_dir(job_id) / "checkpoints" / "latest").exists():
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.05)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    time.sleep(1)
    assert stack.client.get(f"/v1/jobs/{job_id}").json()["status"] == "running"  # stuck, for now

    stack.start_worker()
    _assert_resumed(stack, job_id, stack.job_dir(job_id) / "checkpoints")
    assert (
        f"requeued 1 orphaned training(s): {job_id}" in (stack.log_dir / "worker-1.log").read_text()
    )


def test_a_second_delivery_of_a_running_training_is_dropped(stack_factory):
    from core.settings import Settings
    from service.queue import make_client

    stack = stack_factory(concurrency=2)
    job_id = stack.submit(png_bytes(16, 16), config=LONG).json()["id"]
    stack.wait_for(job_id, lambda j: j["progress"]["step"] > 0, what="training started")
    client = make_client(Settings(data_dir=stack.data_dir, redis_url=None))
    client.send_task("nf.train", args=[job_id], queue="train")  # as a broker redelivery would
    log = stack.log_dir / "worker-0.log"
    deadline = time.monotonic() + 30
    while "being trained by another process" not in log.read_text():
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.1)
    stack.client.post(f"/v1/jobs/{job_id}/cancel")
    assert (
        stack.wait_status(job_id, "cancelled", "failed", "succeeded", timeout=20)["status"]
        == "cancelled"
    )
    statuses = [e["data"]["status"] for e in _events(stack, job_id) if e["event"] == "status"]
    assert statuses == ["queued", "running", "cancelled"]
    steps = [e["data"]["step"] for e in _events(stack, job_id) if e["event"] == "progress"]
    assert steps == sorted(steps)  # one trainer all along
