"""Volume compositing over packed samples (nerfacc layout)."""

from __future__ import annotations

import torch

from . import _ext
from .hash_grid import _check_backend

EARLY_STOP_T = 1e-4


def ray_offsets(ray_indices: torch.Tensor, n_rays: int) -> torch.Tensor:
    """Start of each ray's samples in a packed array.

    Args:
        ray_indices: (S,) int, the ray of each sample, non-decreasing, in [0, n_rays).
        n_rays: number of rays.

    Returns:
        (n_rays + 1,) int64 offsets: ray r owns samples [offsets[r], offsets[r + 1]).

    Raises:
        ValueError: ray_indices unsorted or outside [0, n_rays).
    """
    ri = ray_indices.long()
    if ri.numel() and ((ri[1:] < ri[:-1]).any() or ri[0] < 0 or ri[-1] >= n_rays):
        raise ValueError(
            "ray_indices must be sorted (samples packed per ray) and within [0, n_rays)"
        )
    counts = torch.bincount(ri, minlength=n_rays)
    offsets = torch.zeros(n_rays + 1, dtype=torch.int64, device=ri.device)
    torch.cumsum(counts, 0, out=offsets[1:])
    return offsets


def render_weights_reference(sigmas, t_starts, t_ends, ray_indices, n_rays, offsets=None):
    """Per-sample weights T*alpha with early stop, pure torch."""
    if offsets is None:
        offsets = ray_offsets(ray_indices, n_rays)
    ri = ray_indices.long()
    tau = sigmas * (t_ends - t_starts)
    # Segmented exclusive sum in float64: one global cumsum over all rays would otherwise lose the
    # small per-ray optical depths against the large running total.
    cs = torch.cumsum(tau.double(), 0)
    incl_start = torch.cat([cs.new_zeros(1), cs])[offsets[:-1]][ri]
    excl = (cs - tau.double() - incl_start).to(sigmas.dtype)
    trans = torch.exp(-excl)
    alive = trans >= EARLY_STOP_T
    alive = alive & _prefix_all(alive, ri, offsets)
    return torch.where(alive, trans * -torch.expm1(-tau), torch.zeros_like(tau))


def _prefix_all(mask, ri, offsets):
    # A sample is kept only if no earlier sample of its ray stopped (transmittance only falls,
    # so this is a no-op except for round-off; it mirrors the kernel's `break`).
    dead = (~mask).long()
    cd = torch.cumsum(dead, 0)
    before = torch.cat([cd.new_zeros(1), cd])[offsets[:-1]][ri]
    return (cd - dead - before) == 0


def composite_reference(sigmas, rgbs, t_starts, t_ends, ray_indices, n_rays, offsets=None):
    w = render_weights_reference(sigmas, t_starts, t_ends, ray_indices, n_rays, offsets)
    ri = ray_indices.long()
    rgb = torch.zeros(n_rays, 3, dtype=rgbs.dtype, device=rgbs.device).index_add(
        0, ri, w[:, None] * rgbs
    )
    depth = torch.zeros(n_rays, dtype=w.dtype, device=w.device).index_add(
        0, ri, w * 0.5 * (t_starts + t_ends)
    )
    opacity = torch.zeros(n_rays, dtype=w.dtype, device=w.device).index_add(0, ri, w)
    return rgb, depth, opacity


class _CompositeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, sigmas, rgbs, t_starts, t_ends, offsets):
        mod = _ext.for_tensor(sigmas)
        rgb, depth, opacity = mod.composite_forward(
            sigmas, rgbs, t_starts, t_ends, offsets, EARLY_STOP_T
        )
        ctx.save_for_backward(sigmas, rgbs, t_starts, t_ends, offsets)
        return rgb, depth, opacity

    @staticmethod
    def backward(ctx, g_rgb, g_depth, g_opacity):
        sigmas, rgbs, t_starts, t_ends, offsets = ctx.saved_tensors
        n = offsets.numel() - 1

        def dense(g, shape):
            return (
                torch.zeros(shape, dtype=sigmas.dtype, device=sigmas.device)
                if g is None
                else g.contiguous()
            )

        mod = _ext.for_tensor(sigmas)
        gs, gc = mod.composite_backward(
            sigmas,
            rgbs,
            t_starts,
            t_ends,
            offsets,
            EARLY_STOP_T,
            dense(g_rgb, (n, 3)),
            dense(g_depth, (n,)),
            dense(g_opacity, (n,)),
        )
        return gs, gc, None, None, None


def composite(
    sigmas: torch.Tensor,
    rgbs: torch.Tensor,
    t_starts: torch.Tensor,
    t_ends: torch.Tensor,
    ray_indices: torch.Tensor,
    n_rays: int,
    background: torch.Tensor | float | None = None,
    *,
    offsets: torch.Tensor | None = None,
    backend: str = "ext",
):
    """Volume-render packed samples: alpha = 1 - exp(-sigma * dt), weight = T * alpha.

    A ray stops once its transmittance T drops below 1e-4; later samples get zero weight and zero
    gradient. Differentiable w.r.t. sigmas and rgbs.

    Args:
        sigmas: (S,) or (S, 1) densities, S samples of all rays packed, sorted by ray.
        rgbs: (S, 3) colours. Half precision (autocast) is cast to the sigmas' float dtype.
        t_starts: (S,) interval starts along each ray, in units of |rays_d|.
        t_ends: (S,) interval ends.
        ray_indices: (S,) int, the ray of each sample, non-decreasing, in [0, n_rays).
        n_rays: number of rays.
        background: None, a scalar, (3,) or (n_rays, 3); fills the remaining 1 - opacity.
        offsets: (n_rays + 1,) int64 start of each ray's samples (march_rays returns them); saves
            recomputing them. Checked: starts at 0, ends at S, never decreases.
        backend: "ext" (compiled, CPU or CUDA by the tensors' device) or "reference" (pure torch).

    Returns:
        rgb (n_rays, 3), depth (n_rays,) = sum(weight * t_mid), not divided by opacity, and
        opacity (n_rays,) = sum(weight), in the sigmas' dtype (float32 for half inputs).

    Raises:
        ValueError: mismatched shapes, unsorted or out-of-range ray_indices, invalid offsets.
    """
    _check_backend(backend)
    s = sigmas.reshape(-1)
    if rgbs.shape != (s.shape[0], 3):
        raise ValueError(f"rgbs must be ({s.shape[0]}, 3), got {tuple(rgbs.shape)}")
    t0, t1 = t_starts.reshape(-1), t_ends.reshape(-1)
    if t0.shape != s.shape or t1.shape != s.shape:
        raise ValueError(f"t_starts and t_ends must hold {s.shape[0]} samples")
    # One dtype for every sample array (autocast hands over half-precision colours): the kernels
    # read float32 or float64 only, and the cast is differentiable.
    dtype = s.dtype if s.dtype in (torch.float32, torch.float64) else torch.float32
    s, rgbs, t0, t1 = s.to(dtype), rgbs.to(dtype), t0.to(dtype), t1.to(dtype)
    if offsets is None:
        ri = ray_indices.reshape(-1)
        if backend == "ext" and ri.device.type == "cpu":
            try:
                offsets = _ext.load_cpu().ray_offsets(ri.long().contiguous(), n_rays)
            except ValueError as exc:
                raise ValueError(str(exc).split("\n")[0]) from None
        else:
            offsets = ray_offsets(ri, n_rays)
    if backend == "reference":
        rgb, depth, opacity = composite_reference(
            s, rgbs, t0, t1, ray_indices.reshape(-1), n_rays, offsets
        )
    else:
        rgb, depth, opacity = _CompositeFn.apply(
            s.contiguous(),
            rgbs.contiguous(),
            t0.contiguous(),
            t1.contiguous(),
            offsets.contiguous(),
        )
    if background is not None:
        bg = torch.as_tensor(background, dtype=rgb.dtype, device=rgb.device)
        rgb = rgb + (1.0 - opacity)[:, None] * bg
    return rgb, depth, opacity
