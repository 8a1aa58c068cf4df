"""ProgressReporter: throttling, and the heartbeat that covers slow steps."""

from __future__ import annotations

import time

import pytest

from core.storage import LocalStorage
from core.store import JobStore
from worker.progress import ProgressReporter


def _store(tmp_path):
    storage = LocalStorage(tmp_path)
    job_id, _ = storage.new_job_dir()
    store = JobStore(storage)
    store.create(job_id, "image", {}, {})
    return store, job_id


def test_reports_are_throttled_but_the_last_step_always_lands(tmp_path):
    store, job_id = _store(tmp_path)
    rep = ProgressReporter(store, job_id, interval_s=0.5)
    written = [rep.report(step, 100, loss=0.1) for step in range(1, 101)]
    assert written[0] and written[-1] and sum(written) == 2  # fast steps: first and last only
    assert store.get(job_id).progress.step == 100
    steps = [e["data"]["step"] for e in store.events(job_id) if e["event"] == "progress"]
    assert steps == [1, 100]


@pytest.mark.alone  # the heartbeat's gaps are wall time: nothing may run beside it
def test_heartbeat_during_a_slow_step(tmp_path):
    store, job_id = _store(tmp_path)
    with ProgressReporter(store, job_id, interval_s=0.2) as rep:
        rep.report(3, 10, loss=0.5, psnr=3.0)
        time.sleep(1.0)  # one step that takes five intervals
    progress = [e["data"] for e in store.events(job_id) if e["event"] == "progress"]
    assert len(progress) >= 4
    assert {p["step"] for p in progress} == {3}
    elapsed = [p["elapsed_s"] for p in progress]
    assert (
        elapsed == sorted(elapsed)
        and max(b - a for a, b in zip(elapsed, elapsed[1:])) <= 0.2 * 1.5 + 0.1
    )
    n = len(progress)
    time.sleep(0.5)  # stopped with the context: no more writes
    assert len([e for e in store.events(job_id) if e["event"] == "progress"]) == n
