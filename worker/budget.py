"""A training job's wall-time budget: training steps, test-curve points, checkpoint writes and the
final evaluation all count against `time_limit_s` (or the device's default when a job sets none).

Training stops early enough to leave room for the final evaluation (estimated from what the
curve points measured, at most EVAL_SHARE of the budget); the evaluation then starts no frame it
expects to finish later than the budget plus the allowance.
"""

from __future__ import annotations

import time
from typing import Any

from api_schemas.nerf import DEFAULT_TIME_LIMIT_S

EVAL_SHARE = 0.1  # the most of a budget the final evaluation may be planned to take
# How far past its budget a job may end: the frame being evaluated and writing the results.
ALLOWANCE_MIN_S = 10.0
ALLOWANCE_SHARE = 0.05


def device_type(device: Any) -> str:
    t = getattr(device, "type", None) or str(device or "cpu")
    return "cuda" if t.startswith("cuda") else "cpu"


def time_limit(config: dict[str, Any], device: Any) -> float:
    """The job's budget in seconds: its `time_limit_s`, else the default for the device."""
    limit = config.get("time_limit_s")
    return float(limit) if limit else float(DEFAULT_TIME_LIMIT_S[device_type(device)])


def allowance(limit_s: float) -> float:
    """Seconds a job may end past its budget (the evaluation in flight and result writes)."""
    return max(ALLOWANCE_MIN_S, ALLOWANCE_SHARE * limit_s)


class TimeBudget:
    """Wall seconds used by this job since training started, over resumes (`used_s` carries what
    earlier runs used, from the checkpoint)."""

    def __init__(self, limit_s: float, used_s: float = 0.0):
        self.limit_s = float(limit_s)
        self._base = float(used_s)
        self._t0 = time.monotonic()
        self.eval_s_per_frame: float | None = None  # measured by test-curve points

    def used(self) -> float:
        return self._base + time.monotonic() - self._t0

    def left(self) -> float:
        return self.limit_s - self.used()

    def eval_reserve(self, n_frames: int) -> float:
        """Seconds kept for the final evaluation of n_frames test frames."""
        cap = EVAL_SHARE * self.limit_s
        if self.eval_s_per_frame is None:
            return cap
        return min(cap, self.eval_s_per_frame * n_frames)

    def training_end(self, n_frames: int) -> float:
        """Budget seconds at which training should stop."""
        return self.limit_s - self.eval_reserve(n_frames)

    def frames_that_fit(self, n_frames: int) -> int:
        """How many test frames the final evaluation can render within budget + allowance."""
        if self.eval_s_per_frame is None or self.eval_s_per_frame <= 0:
            return n_frames
        room = self.left() + allowance(self.limit_s)
        return max(1, min(n_frames, int(room / self.eval_s_per_frame)))
