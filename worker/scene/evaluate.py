"""Test-split evaluation shared by the scene kinds: per-view PSNR and SSIM (LPIPS where its
weights are present) of renders against the held-out photos, composited on the evaluation
background. Masked pixels (the upload's masks, or pixels a resampled view has no photo for) do
not count in PSNR and SSIM; LPIPS sees whole images. The kind supplies only
`render_view(i) -> (rgb, depth)`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import numpy as np
import torch

from worker.scene.dataset import Dataset, composite_background
from worker.scene.metrics import psnr, ssim

# (H, W, 3) float rgb in [0, 1], and (H, W) depth in world units (0: no surface) or None
RenderView = Callable[[int], tuple[np.ndarray, np.ndarray | None]]


@dataclass
class ViewResult:
    index: int
    name: str  # the view's image in the dataset (images/0007.png)
    source: str | None  # where it came from in the upload
    scores: dict[str, float]
    rgb: np.ndarray = field(repr=False)
    depth: np.ndarray | None = field(repr=False)

    @property
    def row(self) -> dict:
        """The view's line in results.json."""
        out = {"index": self.index, "name": self.name}
        if self.source:
            out["source"] = self.source
        return {**out, **{k: round(v, 5) for k, v in self.scores.items()}}


def ground_truth(data: Dataset, i: int, background: torch.Tensor) -> np.ndarray:
    return composite_background(data.frame_rgba(i), background.cpu()).numpy()


def evaluate(
    render_view: RenderView,
    data: Dataset,
    background: torch.Tensor,
    keep: int = 0,
    limit: int | None = None,
    lpips=None,
    on_view: Callable[[ViewResult], None] | None = None,
) -> tuple[dict[str, float], list[tuple[int, np.ndarray]]]:
    """Mean scores over the first `limit` views of `data` (all by default) and the first `keep`
    renders (index, (H, W, 3) float). `on_view` sees every view with its render as it is scored;
    `lpips` (worker.scene.metrics.Lpips) adds that score."""
    n = len(data) if limit is None else min(limit, len(data))
    scores: dict[str, list[float]] = {"psnr": [], "ssim": []}
    kept = []
    for i in range(n):
        pred, depth = render_view(i)
        gt = ground_truth(data, i, background)
        mask = data.frame_mask(i)
        mask = None if mask is None else mask.numpy()
        view = {}
        if mask is None or mask.any():  # a view whose mask keeps nothing has no score
            view = {"psnr": psnr(pred, gt, mask), "ssim": ssim(pred, gt, mask)}
            if lpips is not None:
                view["lpips"] = lpips(pred, gt)
            view = {k: v for k, v in view.items() if math.isfinite(v)}
        for k, v in view.items():
            scores.setdefault(k, []).append(v)
        if i < keep:
            kept.append((i, pred))
        if on_view is not None:
            f = data.frames[i]
            on_view(ViewResult(i, str(PurePosixPath(f.file)), f.source, view, pred, depth))
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
