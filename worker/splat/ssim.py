"""Differentiable SSIM (Gaussian window 11, sigma 1.5, as the 3DGS loss uses)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _window(
    size: int = 11, sigma: float = 1.5, channels: int = 3, dtype=torch.float32, device=None
):
    x = torch.arange(size, dtype=dtype, device=device) - size // 2
    g = torch.exp(-x * x / (2 * sigma * sigma))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).expand(channels, 1, size, size).contiguous()


def ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Mean SSIM of two (H, W, 3) images in [0, 1]."""
    x, y = a.permute(2, 0, 1)[None], b.permute(2, 0, 1)[None]
    w = _window(dtype=a.dtype, device=a.device)
    pad = w.shape[-1] // 2

    def blur(t):
        return F.conv2d(t, w, padding=pad, groups=3)

    mx, my = blur(x), blur(y)
    sxx = blur(x * x) - mx * mx
    syy = blur(y * y) - my * my
    sxy = blur(x * y) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return s.mean()
