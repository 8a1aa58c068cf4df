"""Image quality metrics, written once for every kind: PSNR, SSIM, and LPIPS where its weights
are on this worker.

Images are float arrays in [0, 1], (H, W, 3). PSNR is capped at 100 dB (MSE floor 1e-10) so
that a perfect fit still serialises as a JSON number.
"""

from __future__ import annotations

import logging
import math
from functools import lru_cache
from pathlib import Path

import numpy as np
from skimage.metrics import structural_similarity

log = logging.getLogger(__name__)
MSE_FLOOR = 1e-10


def psnr_from_mse(mse: float) -> float:
    """PSNR in dB of a mean squared error of [0, 1] images."""
    return -10.0 * math.log10(max(float(mse), MSE_FLOOR))


SSIM_WIN = 7  # scikit-image's default window


def psnr(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None = None) -> float:
    """PSNR of (H, W, 3) images over all pixels, or over those where `mask` (H, W) is set."""
    sq = (a.astype(np.float64) - b.astype(np.float64)) ** 2
    return psnr_from_mse(np.mean(sq if mask is None else sq[mask]))


def ssim(a: np.ndarray, b: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Mean SSIM (scikit-image: 7x7 uniform window, the defaults of its reference), over the
    pixels where `mask` (H, W) is set when given (of the map scikit-image averages, which leaves
    out a half window at the border)."""
    if mask is None:
        return float(structural_similarity(a, b, channel_axis=2, data_range=1.0))
    _, full = structural_similarity(a, b, channel_axis=2, data_range=1.0, full=True)
    pad = (SSIM_WIN - 1) // 2
    inner = (slice(pad, -pad), slice(pad, -pad))
    m = mask[inner]
    return float(full[inner][m].mean()) if m.any() else float("nan")


class Lpips:
    """LPIPS (Zhang et al. 2018) from a TorchScript file at LPIPS_MODEL: a module taking two
    (N, 3, H, W) images in [-1, 1] and returning (N, 1, 1, 1) distances, e.g.
    `torch.jit.script(lpips.LPIPS(net="alex"))` saved on a machine that has the weights.
    Weights are never downloaded here."""

    def __init__(self, path: Path):
        import torch

        self.torch = torch
        self.module = torch.jit.load(str(path), map_location="cpu").eval()

    def __call__(self, a: np.ndarray, b: np.ndarray) -> float:
        t = self.torch

        def prep(x):
            return t.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).permute(2, 0, 1)[None]

        with t.no_grad():
            return float(self.module(prep(a) * 2 - 1, prep(b) * 2 - 1).reshape(-1)[0])


@lru_cache(maxsize=4)
def _load(path: str) -> Lpips:
    return Lpips(Path(path))


def lpips_metric(model_path: str | Path | None) -> tuple[Lpips | None, str | None]:
    """(metric, None) when LPIPS_MODEL names a loadable file, else (None, why it is absent)."""
    if not model_path:
        return None, "LPIPS_MODEL is not set on this worker (its weights are never downloaded)"
    path = Path(model_path)
    if not path.is_file():
        return None, f"LPIPS_MODEL {path} is not a file on this worker"
    try:
        return _load(str(path)), None
    except Exception as exc:  # a corrupt or foreign file must not fail the training
        log.warning("could not load LPIPS_MODEL %s: %s", path, exc)
        return None, f"LPIPS_MODEL {path} could not be loaded ({type(exc).__name__})"
