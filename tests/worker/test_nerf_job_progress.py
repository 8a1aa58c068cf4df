"""Slow steps (a nerf step on a busy CPU can take seconds): the heartbeat's repeats must not
throttle away the step's own progress report."""

from __future__ import annotations

import time

from worker.progress import ProgressReporter


class _Store:
    def __init__(self):
        self.written = []

    def set_progress(self, job_id, progress):
        self.written.append(progress)


def test_report_after_a_slow_step_is_written_despite_heartbeats():
    store = _Store()
    with ProgressReporter(store, "job", interval_s=0.2) as rep:
        rep.report(0, 10, force=True)
        for step in (1, 2):
            time.sleep(0.6)  # a step slower than the interval: the heartbeat writes meanwhile
            assert rep.report(step, 10, loss=0.1, psnr=10.0, rays_per_s=5.0, samples_per_ray=3.0)
            assert store.written[-1].step == step and store.written[-1].rays_per_s == 5.0
    assert any(p.step == 1 for p in store.written) and len(store.written) > 3


def test_eta_never_passes_the_deadline():
    # Step-based ETA says ~100 s (1 step in ~1 s of 100); the job's budget ends in 5 s.
    store = _Store()
    rep = ProgressReporter(store, "job", interval_s=0.0)
    rep.t0 -= 1.0
    rep.report(1, 101, force=True)
    assert store.written[-1].eta_s > 50
    rep.set_deadline(5.0)
    rep.report(2, 101, force=True)
    assert 4.0 < store.written[-1].eta_s <= 5.0
    rep.set_deadline(-1.0)  # over budget: the job is finishing now
    rep.report(3, 101, force=True)
    assert store.written[-1].eta_s == 0.0


def test_budget_reserves_evaluation_and_counts_resumed_time():
    from worker.budget import EVAL_SHARE, TimeBudget, allowance, time_limit

    assert time_limit({"time_limit_s": None}, "cpu") < time_limit({"time_limit_s": None}, "cuda")
    assert time_limit({"time_limit_s": 42}, "cuda") == 42
    b = TimeBudget(100.0, used_s=30.0)
    assert 30.0 <= b.used() < 31.0
    assert b.training_end(50) == 100.0 - EVAL_SHARE * 100.0  # nothing measured yet: the cap
    b.eval_s_per_frame = 0.5
    assert b.training_end(4) == 98.0
    assert b.frames_that_fit(1000) == int((b.left() + allowance(100.0)) / 0.5)
    assert allowance(100.0) == 10.0 and allowance(1000.0) == 50.0
