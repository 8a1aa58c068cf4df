"""Training progress: throttled writes into job.json and events.jsonl (the SSE stream's source)."""

from __future__ import annotations

import math
import time

from api_schemas.jobs import Progress
from service.store import JobStore


class ProgressReporter:
    """Call `report` every step; it writes at most every `interval_s` (and always on the last
    step), which keeps the promise of a progress write at least once a second."""

    def __init__(self, store: JobStore, job_id: str, interval_s: float = 0.5, start_step: int = 0):
        self.store = store
        self.job_id = job_id
        self.interval_s = interval_s
        self.t0 = time.monotonic()
        self.start_step = start_step
        self._last_write = 0.0
        self.last: Progress | None = None

    @staticmethod
    def _clean(x: float | None) -> float | None:
        if x is None:
            return None
        x = float(x)
        return x if math.isfinite(x) else None

    def report(self, step: int, total_steps: int, loss: float | None = None, psnr: float | None = None,
               force: bool = False) -> bool:
        now = time.monotonic()
        if not force and step < total_steps and now - self._last_write < self.interval_s:
            return False
        elapsed = now - self.t0
        done = step - self.start_step
        eta = elapsed / done * (total_steps - step) if done > 0 else None
        self.last = Progress(step=step, total_steps=total_steps, loss=self._clean(loss), psnr=self._clean(psnr),
                             elapsed_s=round(elapsed, 3), eta_s=None if eta is None else round(eta, 3))
        self.store.set_progress(self.job_id, self.last)
        self._last_write = now
        return True
