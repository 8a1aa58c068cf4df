"""A training job's wall-time budget: training steps, test-curve points, checkpoint writes and the
final evaluation all count against `time_limit_s` (or the device's default when a job sets none).

Where the rest goes, so that training gets most of it: curve points render a fixed pixel
subsample of the test views and take at most CURVE_SHARE of the training time; checkpoint writes
at most worker.checkpoints.MAX_SHARE of the time between them; the final evaluation scores every
test view at full size: training stops early enough for it (what the measured render speed says
it takes, up to EVAL_MAX_SHARE of the budget). Only a worker too slow for that scores views at a
pixel stride (every s-th pixel of every s-th row), chosen view by view, and the metrics say so
(`eval_scale` below 1).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from api_schemas.nerf import DEFAULT_TIME_LIMIT_S

EVAL_SHARE = 0.1  # what the final evaluation is planned to take before a render speed is known
# The most of a budget kept for a full-size evaluation; past it views are scored at a stride.
EVAL_MAX_SHARE = 0.25
CURVE_SHARE = 0.02  # the most of the training time test-curve points may take
# The final evaluation also scores and encodes what it renders; curve points only render.
EVAL_OVERHEAD = 1.5
# Room kept beyond the estimate: the last step and checkpoint run past the training end, and a
# render speed measured earlier in training may be off.
EVAL_MARGIN = 1.5
MIN_EVAL_PIXELS = 1024  # however short the time, a view is scored on at least about this many
# How far past its budget a job may end: the frame being evaluated and writing the results.
ALLOWANCE_MIN_S = 10.0
ALLOWANCE_SHARE = 0.05


def device_type(device: Any) -> str:
    t = getattr(device, "type", None) or str(device or "cpu")
    return "cuda" if t.startswith("cuda") else "cpu"


def time_limit(limit_s: float | None, device: Any) -> float:
    """The job's budget in seconds: its config's `time_limit_s`, else the default for the device."""
    return float(limit_s) if limit_s else float(DEFAULT_TIME_LIMIT_S[device_type(device)])


def allowance(limit_s: float) -> float:
    """Seconds a job may end past its budget (the evaluation in flight and result writes)."""
    return max(ALLOWANCE_MIN_S, ALLOWANCE_SHARE * limit_s)


class TimeBudget:
    """Wall seconds used by this job since training started, over resumes (`used_s` carries what
    earlier runs used, from the checkpoint), and what went to curve points, checkpoints and the
    evaluation (`spent`, also carried over resumes)."""

    def __init__(self, limit_s: float, used_s: float = 0.0, spent: dict[str, float] | None = None):
        self.limit_s = float(limit_s)
        self._base = float(used_s)
        self._t0 = time.monotonic()
        self.spent = {"curve": 0.0, "checkpoint": 0.0, "eval": 0.0, **(spent or {})}
        # seconds to render one test pixel, measured by curve points (None: not yet)
        self.eval_s_per_pixel: float | None = None

    def used(self) -> float:
        return self._base + time.monotonic() - self._t0

    def left(self) -> float:
        return self.limit_s - self.used()

    def eval_reserve(self, view_pixels: Sequence[int]) -> float:
        """Seconds kept for the final evaluation of every test view (their pixel counts)."""
        if self.eval_s_per_pixel is None:
            return EVAL_SHARE * self.limit_s
        full = self.eval_s_per_pixel * EVAL_OVERHEAD * sum(view_pixels)
        return min(EVAL_MARGIN * full, EVAL_MAX_SHARE * self.limit_s)

    def training_end(self, view_pixels: Sequence[int]) -> float:
        """Budget seconds at which training should stop."""
        return self.limit_s - self.eval_reserve(view_pixels)

    def shares(self, train_s: float) -> dict[str, float]:
        """What each part took, as a share of the budget."""
        out = {"train": train_s, **self.spent}
        return {k: round(v / self.limit_s, 4) for k, v in out.items()}


class EvalPlan:
    """Pixel strides for the final evaluation: every view is scored, each at the smallest stride
    (1: every pixel) whose estimated cost lets the views still to come finish by the end of the
    budget. The estimate starts from the curve points' render speed and then follows what the
    views already scored cost (render, scores and encoding)."""

    def __init__(self, budget: TimeBudget, view_pixels: Sequence[int]):
        self.budget = budget
        self.pixels = list(view_pixels)
        self._seconds = 0.0
        self._done_pixels = 0
        self.strides: list[int] = []

    def s_per_pixel(self) -> float | None:
        if self._done_pixels:
            return self._seconds / self._done_pixels
        if self.budget.eval_s_per_pixel is None:
            return None
        return self.budget.eval_s_per_pixel * EVAL_OVERHEAD

    def stride(self, i: int) -> int:
        rate = self.s_per_pixel()
        if rate is None:
            return 1
        room = max(self.budget.left(), 1e-3)
        s = math.ceil(math.sqrt(rate * sum(self.pixels[i:]) / room))
        cap = max(1, math.isqrt(max(self.pixels[i] // MIN_EVAL_PIXELS, 1)))
        return max(1, min(s, cap))

    def done(self, pixels: int, seconds: float, stride: int) -> None:
        """A view of `pixels` rendered pixels took `seconds`."""
        self._seconds += seconds
        self._done_pixels += pixels
        self.strides.append(stride)

    @property
    def pixels_per_s(self) -> float | None:
        """Test pixels rendered and scored a second (what a render of a frame may expect)."""
        return round(self._done_pixels / self._seconds, 1) if self._seconds > 0 else None

    @property
    def scale(self) -> float:
        """1 / the largest stride used (1.0: every view at full size)."""
        return 1.0 / max(self.strides, default=1)
