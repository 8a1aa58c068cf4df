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
