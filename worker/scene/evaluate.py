"""Test-split evaluation shared by the scene kinds: per-view PSNR and SSIM (LPIPS where its
weights are present) of renders against the held-out photos, composited on the evaluation
background. Masked pixels (the upload's masks, or pixels a resampled view has no photo for) do
not count in PSNR and SSIM; LPIPS sees whole images. The kind supplies only
`render_view(i) -> (rgb, depth)`, or `render_view(i, stride)` under a plan of pixel strides
(worker.budget.EvalPlan: the render and the photo keep every stride-th pixel of every
stride-th row, so PSNR estimates the full-size score on fewer pixels).

PSNR does not see a render without colour: a grey render of a colourful photo scored 18.4 dB on a
real capture. `colour_ratio` (the render's mean chroma, max - min of R, G, B, over the photo's)
shows it: near 1 when the colours are there, near 0 for grey; the job warns under GREY_RATIO."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import numpy as np
import torch

from worker.scene.dataset import Dataset, composite_background
from worker.scene.metrics import psnr, ssim

# (H, W, 3) float rgb in [0, 1], and (H, W) depth in world units (0: no surface) or None
RenderView = Callable[..., tuple[np.ndarray, np.ndarray | None]]
MIN_PHOTO_CHROMA = 0.02  # photos greyer than this have no colour a render could miss
GREY_RATIO = 0.25


@dataclass
class ViewResult:
    index: int
    name: str  # the view's image in the dataset (images/0007.png)
    source: str | None  # where it came from in the upload
    scores: dict[str, float]
    rgb: np.ndarray = field(repr=False)
    depth: np.ndarray | None = field(repr=False)
    stride: int = 1  # every stride-th pixel of every stride-th row was rendered and scored

    @property
    def row(self) -> dict:
        """The view's line in results.json."""
        out = {"index": self.index, "name": self.name}
        if self.source:
            out["source"] = self.source
        out["stride"] = self.stride
        return {**out, **{k: round(v, 5) for k, v in self.scores.items()}}


def ground_truth(data: Dataset, i: int, background: torch.Tensor) -> np.ndarray:
    return composite_background(data.frame_rgba(i), background.cpu()).numpy()


def chroma(rgb: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Mean of max - min over R, G, B (0 for a grey image) of the pixels `mask` keeps."""
    c = rgb.max(axis=-1) - rgb.min(axis=-1)
    return float(c[mask].mean() if mask is not None else c.mean())


def colour_warning(metrics: dict) -> str | None:
    """A readable warning when the renders lost the photos' colour (None when they kept it)."""
    ratio = metrics.get("test_colour_ratio")
    if ratio is None or ratio >= GREY_RATIO:
        return None
    return (
        f"the test renders are nearly grey: {ratio:.2f} of the held-out photos' colour "
        "(colour_ratio); the field has not learned colour, whatever PSNR says"
    )


def evaluate(
    render_view: RenderView,
    data: Dataset,
    background: torch.Tensor,
    keep: int = 0,
    limit: int | None = None,
    lpips=None,
    on_view: Callable[[ViewResult], None] | None = None,
    plan=None,
) -> tuple[dict[str, float], list[tuple[int, np.ndarray]]]:
    """Mean scores over the first `limit` views of `data` (all by default) and the first `keep`
    renders (index, (H, W, 3) float). `on_view` sees every view with its render as it is scored;
    `lpips` (worker.scene.metrics.Lpips) adds that score. With a `plan` (worker.budget.EvalPlan)
    view i is rendered as `render_view(i, plan.stride(i))` and its cost reported back."""
    n = len(data) if limit is None else min(limit, len(data))
    scores: dict[str, list[float]] = {"psnr": [], "ssim": []}
    kept = []
    for i in range(n):
        t0 = time.perf_counter()
        s = 1 if plan is None else plan.stride(i)
        pred, depth = render_view(i) if plan is None else render_view(i, s)
        gt = ground_truth(data, i, background)[::s, ::s]
        mask = data.frame_mask(i)
        mask = None if mask is None else mask.numpy()[::s, ::s]
        view = {}
        if mask is None or mask.any():  # a view whose mask keeps nothing has no score
            view = {"psnr": psnr(pred, gt, mask), "ssim": ssim(pred, gt, mask)}
            if lpips is not None:
                view["lpips"] = lpips(pred, gt)
            photo = chroma(gt, mask)
            if photo >= MIN_PHOTO_CHROMA:
                view["colour_ratio"] = chroma(pred, mask) / photo
            view = {k: v for k, v in view.items() if math.isfinite(v)}
        for k, v in view.items():
            scores.setdefault(k, []).append(v)
        if i < keep:
            kept.append((i, pred))
        if on_view is not None:
            f = data.frames[i]
            on_view(ViewResult(i, str(PurePosixPath(f.file)), f.source, view, pred, depth, s))
        if plan is not None:
            plan.done(pred.shape[0] * pred.shape[1], time.perf_counter() - t0, s)
    metrics = {f"test_{k}": float(np.mean(v)) for k, v in scores.items() if v}
    metrics["n_test"] = n
    return metrics, kept


def background_psnr(data: Dataset, background: torch.Tensor) -> float | None:
    """PSNR of an image that is only the background: the floor any trained scene must beat
    (None when masks keep no pixel of any view)."""
    bg = background.cpu().numpy()
    vals = []
    for i in range(len(data)):
        mask = data.frame_mask(i)
        mask = None if mask is None else mask.numpy()
        if mask is None or mask.any():
            gt = ground_truth(data, i, background)
            vals.append(psnr(np.broadcast_to(bg, gt.shape), gt, mask))
    return float(np.mean(vals)) if vals else None
