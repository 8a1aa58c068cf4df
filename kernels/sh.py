"""Spherical-harmonics direction encoding."""

from __future__ import annotations

import torch

from . import _ext
from .hash_grid import _check_backend


def sh_reference(dirs: torch.Tensor, degree: int = 4) -> torch.Tensor:
    x, y, z = dirs.unbind(-1)
    xy, xz, yz, x2, y2, z2 = x * y, x * z, y * z, x * x, y * y, z * z
    out = [torch.full_like(x, 0.28209479177387814)]
    if degree > 1:
        out += [-0.48860251190291987 * y, 0.48860251190291987 * z, -0.48860251190291987 * x]
    if degree > 2:
        out += [
            1.0925484305920792 * xy,
            -1.0925484305920792 * yz,
            0.94617469575755997 * z2 - 0.31539156525251999,
            -1.0925484305920792 * xz,
            0.54627421529603959 * x2 - 0.54627421529603959 * y2,
        ]
    if degree > 3:
        out += [
            0.59004358992664352 * y * (-3.0 * x2 + y2),
            2.8906114426405538 * xy * z,
            0.45704579946446572 * y * (1.0 - 5.0 * z2),
            0.3731763325901154 * z * (5.0 * z2 - 3.0),
            0.45704579946446572 * x * (1.0 - 5.0 * z2),
            1.4453057213202769 * z * (x2 - y2),
            0.59004358992664352 * x * (-x2 + 3.0 * y2),
        ]
    return torch.stack(out, dim=-1)


class _ShFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dirs, degree):
        ctx.save_for_backward(dirs)
        ctx.degree = degree
        return _ext.for_tensor(dirs).sh_encode(dirs, degree)

    @staticmethod
    def backward(ctx, grad):
        # Direction gradients are rare (view dirs come from cameras), so they go through the
        # reference's autograd instead of a hand-written kernel.
        (dirs,) = ctx.saved_tensors
        with torch.enable_grad():
            d = dirs.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(sh_reference(d, ctx.degree), d, grad)
        return g, None


def sh_encode(dirs: torch.Tensor, degree: int = 4, backend: str = "ext") -> torch.Tensor:
    """Real spherical-harmonics basis of unit directions, in tiny-cuda-nn's order and signs.

    Args:
        dirs: (N, 3) unit directions in [-1, 1]^3 (not remapped to [0, 1]), float32 or float64.
        degree: 1..4.
        backend: "ext" or "reference". Gradients to dirs go through the reference's autograd.

    Returns:
        (N, degree**2) basis values in the dirs' dtype.

    Raises:
        ValueError: dirs not (N, 3), degree outside 1..4, or (compiled) a half-precision dtype.
    """
    _check_backend(backend)
    if dirs.dim() != 2 or dirs.shape[1] != 3:
        raise ValueError(f"sh_encode expects (N, 3) directions, got {tuple(dirs.shape)}")
    if not 1 <= degree <= 4:
        raise ValueError(f"degree must be 1..4, got {degree}")
    if backend == "reference":
        return sh_reference(dirs, degree)
    return _ShFn.apply(dirs.contiguous(), degree)
