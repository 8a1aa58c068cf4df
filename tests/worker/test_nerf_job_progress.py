"""Slow steps (a nerf step on a busy CPU can take seconds): the heartbeat's repeats must not
throttle away the step's own progress report."""

from __future__ import annotations

import time

import pytest

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
    from worker.budget import (
        EVAL_MARGIN,
        EVAL_MAX_SHARE,
        EVAL_OVERHEAD,
        EVAL_SHARE,
        TimeBudget,
        allowance,
        time_limit,
    )

    assert time_limit(None, "cpu") < time_limit(None, "cuda")
    assert time_limit(42, "cuda") == 42
    b = TimeBudget(100.0, used_s=30.0, spent={"checkpoint": 2.0})
    assert 30.0 <= b.used() < 31.0
    assert b.spent == {"curve": 0.0, "checkpoint": 2.0, "eval": 0.0}
    views = [250_000] * 4
    assert b.training_end(views) == 100.0 - EVAL_SHARE * 100.0  # nothing measured yet: the cap
    b.eval_s_per_pixel = 1e-6
    assert b.training_end(views) == pytest.approx(100.0 - EVAL_MARGIN * EVAL_OVERHEAD)
    # A full-size evaluation is kept for, however long, up to EVAL_MAX_SHARE of the budget.
    b.eval_s_per_pixel = 1e-5
    assert b.training_end(views) == pytest.approx(100.0 - EVAL_MARGIN * 1e-5 * EVAL_OVERHEAD * 1e6)
    assert b.training_end(views * 10) == 100.0 - EVAL_MAX_SHARE * 100.0
    assert allowance(100.0) == 10.0 and allowance(1000.0) == 50.0
    assert b.shares(80.0) == {"train": 0.8, "curve": 0.0, "checkpoint": 0.02, "eval": 0.0}


def test_eval_plan_scores_every_view_at_the_stride_the_time_left_allows():
    from worker.budget import MIN_EVAL_PIXELS, EvalPlan, TimeBudget

    views = [800 * 450] * 7
    b = TimeBudget(300.0, used_s=270.0)  # 30 s left
    assert EvalPlan(b, views).stride(0) == 1  # nothing measured: full size, then it learns
    # 1e-5 s a pixel (x1.5 to score and encode): 7 full views would take 38 s of the 30 left.
    b.eval_s_per_pixel = 1e-5
    plan = EvalPlan(b, views)
    assert plan.stride(0) == 2
    # The first view turned out slower: the rest go sparser, and no view below ~MIN_EVAL_PIXELS.
    plan.done(400 * 225, 8.0, 2)
    assert plan.stride(1) == 3
    b._base = 10_000.0  # far past the budget: the coarsest stride still scores the view
    s = plan.stride(1)
    assert (800 // s) * (450 // s) >= MIN_EVAL_PIXELS * 0.8 and s > 3
    assert plan.scale == 0.5 and plan.pixels_per_s == 11_250.0
    # Plenty of time: full size.
    assert EvalPlan(TimeBudget(300.0), views).stride(0) == 1


def test_checkpoints_cost_at_most_their_share_of_the_time(tmp_path):
    import torch

    from worker.checkpoints import CheckpointManager

    mgr = CheckpointManager(tmp_path, interval_s=0.0, max_share=0.03)
    assert mgr.due()
    mgr.save(1, {"x": torch.zeros(4)})
    assert mgr.spent_s == mgr.last_cost_s > 0
    mgr.last_cost_s = 1.0  # a 1 s write: the next one waits >= 33 s, whatever the schedule says
    assert not mgr.due() and not mgr.due(marked=True)
    mgr._last_save -= 34.0
    assert mgr.due() and mgr.due(marked=True)
    slow = CheckpointManager(tmp_path, interval_s=30.0)
    assert not slow.due() and slow.due(marked=True)  # a cheap save on the caller's schedule
