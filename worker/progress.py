"""Training progress: throttled writes of the job's progress and its events (the SSE stream's source)."""

from __future__ import annotations

import logging
import math
import threading
import time

from api_schemas.jobs import Progress
from core.store import JobStore

log = logging.getLogger(__name__)
EXTRA_FIELDS = ("rays_per_s", "samples_per_ray", "checkpoint_step")


class ProgressReporter:
    """Call `report` every step; it writes at most every `interval_s` (and always on the last
    step). While running as a context manager, a heartbeat thread re-writes the latest progress
    (fresh elapsed/eta) whenever a step takes longer than the interval, so the promise of a
    progress write at least once a second holds through slow steps too."""

    def __init__(
        self,
        store: JobStore,
        job_id: str,
        interval_s: float = 0.5,
        start_step: int = 0,
        stage: str | None = None,
    ):
        self.store = store
        self.stage = stage
        self.job_id = job_id
        self.interval_s = interval_s
        self.t0 = time.monotonic()
        self.start_step = start_step
        self._last_write = 0.0
        self._last_report = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last: Progress | None = None
        self.deadline: float | None = None  # monotonic time the job's budget runs out

    def set_deadline(self, seconds_from_now: float | None) -> None:
        """The job ends by then (its time budget): the ETA is never later than that."""
        self.deadline = None if seconds_from_now is None else time.monotonic() + seconds_from_now

    @staticmethod
    def _clean(x: float | None) -> float | None:
        if x is None:
            return None
        x = float(x)
        return x if math.isfinite(x) else None

    def _progress(
        self, step: int, total_steps: int, loss, psnr, now: float, extra=None
    ) -> Progress:
        elapsed = now - self.t0
        done = step - self.start_step
        eta = elapsed / done * (total_steps - step) if done > 0 else None
        if self.deadline is not None and step < total_steps:
            left = max(self.deadline - now, 0.0)
            eta = left if eta is None else min(eta, left)
        return Progress(
            stage=self.stage,
            step=step,
            total_steps=total_steps,
            loss=self._clean(loss),
            psnr=self._clean(psnr),
            elapsed_s=round(elapsed, 3),
            eta_s=None if eta is None else round(eta, 3),
            **{k: self._clean(v) for k, v in (extra or {}).items()},
        )

    def _write(self, progress: Progress, now: float) -> None:
        self.store.set_progress(self.job_id, progress)
        self.last = progress
        self._last_write = now

    def due(self, step: int, total_steps: int) -> bool:
        """Whether `report(step, total_steps, ...)` would write now: a trainer on a GPU reads its
        loss back (a host synchronisation) only then."""
        return step >= total_steps or time.monotonic() - self._last_report >= self.interval_s

    def report(
        self,
        step: int,
        total_steps: int,
        loss: float | None = None,
        psnr: float | None = None,
        force: bool = False,
        **extra: float | None,
    ) -> bool:
        """`extra`: further Progress fields (rays_per_s, samples_per_ray)."""
        now = time.monotonic()
        # Throttled on the last *report*: heartbeat writes during a slow step must not swallow
        # the step's own (new) progress.
        if not force and step < total_steps and now - self._last_report < self.interval_s:
            return False
        with self._lock:
            self._write(self._progress(step, total_steps, loss, psnr, now, extra), now)
            self._last_report = now
        return True

    # -- heartbeat ---------------------------------------------------------------------
    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s / 2):
            now = time.monotonic()
            if self.last is None or now - self._last_write < self.interval_s:
                continue
            with self._lock:
                p = self.last
                if p is None or time.monotonic() - self._last_write < self.interval_s:
                    continue
                try:
                    extra = {k: getattr(p, k) for k in EXTRA_FIELDS}
                    self._write(
                        self._progress(p.step, p.total_steps, p.loss, p.psnr, now, extra), now
                    )
                except Exception:  # the job folder may be going away; the task decides
                    log.debug("progress heartbeat write failed", exc_info=True)

    def __enter__(self) -> ProgressReporter:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._beat, name=f"progress-{self.job_id[:8]}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
