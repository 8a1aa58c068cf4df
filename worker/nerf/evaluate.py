"""Test-split quality: PSNR and SSIM of renders against the held-out photos on the eval background."""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
from skimage.metrics import structural_similarity

from worker.nerf.data import Dataset, composite_background
from worker.nerf.rendering import render_image


def psnr_np(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse <= 0 else -10.0 * math.log10(mse)


def ssim_np(a: np.ndarray, b: np.ndarray) -> float:
    return float(structural_similarity(a, b, channel_axis=2, data_range=1.0))


def render_frame(trainer, data: Dataset, i: int) -> np.ndarray:
    f = data.frames[i]
    o, d = data.frame_rays(i)
    dev = trainer.device
    rgb, _, _, _ = render_image(
        trainer.field,
        trainer.grid,
        o.to(dev),
        d.to(dev),
        trainer.eval_background,
        step=trainer.step_size,
        cone_angle=trainer.config["cone_angle"],
        max_samples=trainer.config["max_samples_per_ray"],
    )
    return rgb.clamp(0, 1).reshape(f.h, f.w, 3).cpu().numpy()


def ground_truth(trainer, data: Dataset, i: int) -> np.ndarray:
    return composite_background(data.frame_rgba(i), trainer.eval_background.cpu()).numpy()


@contextmanager
def measured_with_kernels(trainer):
    """Evaluate with the compiled kernels even when training runs on the references: the ops
    are parity-tested, so the numbers are the same, and a reference-backend run is not slowed
    down further (or its curve made sparser) by its own measurements."""
    from kernels import compiled_available

    if not compiled_available(trainer.field.encoding.params.device):
        yield
        return
    saved = trainer.field.backend, trainer.field.encoding.backend, trainer.grid.backend
    trainer.field.backend = trainer.field.encoding.backend = trainer.grid.backend = "ext"
    try:
        yield
    finally:
        trainer.field.backend, trainer.field.encoding.backend, trainer.grid.backend = saved


def evaluate(
    trainer, data: Dataset, keep: int = 0, limit: int | None = None
) -> tuple[dict[str, float], list[tuple[int, np.ndarray]]]:
    """Mean PSNR/SSIM over the frames of `data` (the first `limit`), plus the first `keep` renders
    (index, HxWx3 float)."""
    trainer.field.eval()
    psnrs, ssims, kept = [], [], []
    n = len(data) if limit is None else min(limit, len(data))
    for i in range(n):
        with measured_with_kernels(trainer):
            pred = render_frame(trainer, data, i)
        gt = ground_truth(trainer, data, i)
        psnrs.append(psnr_np(pred, gt))
        ssims.append(ssim_np(pred, gt))
        if i < keep:
            kept.append((i, pred))
    return {
        "test_psnr": float(np.mean(psnrs)),
        "test_ssim": float(np.mean(ssims)),
        "n_test": n,
    }, kept


def background_psnr(trainer, data: Dataset) -> float:
    """PSNR of an image that is only the background: the floor any trained field must beat."""
    vals = []
    for i in range(len(data)):
        gt = ground_truth(trainer, data, i)
        vals.append(psnr_np(np.broadcast_to(trainer.eval_background.cpu().numpy(), gt.shape), gt))
    return float(np.mean(vals))
