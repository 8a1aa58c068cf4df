"""Regularisers over packed samples (nerfacc layout: samples sorted by ray, `offsets` (N + 1,)
the start of each ray's samples), differentiable in pure torch.

mip-NeRF 360's distortion loss pulls each ray's weights together into as short a stretch as the
photos allow: a field that paints a room as a semi-transparent fog spreads every ray's weight
over hundreds of samples, which the photometric loss alone clears only slowly.
"""

from __future__ import annotations

import torch


def _exclusive_sum(x: torch.Tensor, ray: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Per-ray exclusive prefix sum of x (S,), in float64: one cumsum over all rays would
    otherwise lose a ray's small sums against the running total of the rays before it."""
    cs = torch.cumsum(x.double(), 0)
    start = torch.cat([cs.new_zeros(1), cs]).index_select(0, offsets[:-1]).index_select(0, ray)
    return cs - x.double() - start


def ray_of_samples(offsets: torch.Tensor, n_samples: int) -> torch.Tensor:
    """(S,) int64: the ray each packed sample belongs to."""
    counts = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(
        torch.arange(counts.numel(), device=offsets.device), counts, output_size=n_samples
    )


def render_weights(
    sigma: torch.Tensor, t_starts: torch.Tensor, t_ends: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """Per-sample weights T * alpha (S,), differentiable w.r.t. sigma; the same weights
    `kernels.composite` blends with, without its early stop (the culled samples it keeps end
    before the transmittance runs out)."""
    ray = ray_of_samples(offsets, sigma.numel())
    tau = sigma * (t_ends - t_starts)
    trans = torch.exp(-_exclusive_sum(tau, ray, offsets)).to(sigma.dtype)
    return trans * -torch.expm1(-tau)


def distortion(
    weights: torch.Tensor,
    t_starts: torch.Tensor,
    t_ends: torch.Tensor,
    offsets: torch.Tensor,
) -> torch.Tensor:
    """mip-NeRF 360's distortion loss of each ray (N,): sum over sample pairs of
    w_i w_j |m_i - m_j| (m the interval midpoints) plus 1/3 sum w_i^2 (t1_i - t0_i), in O(S) from
    prefix sums over each ray's samples sorted by t (nerfacc's `distortion`).

    Args:
        weights: (S,) T * alpha of the packed samples.
        t_starts, t_ends: (S,) their intervals along the ray, sorted within each ray.
        offsets: (N + 1,) int64: ray r owns samples [offsets[r], offsets[r + 1]).
    """
    ray = ray_of_samples(offsets, weights.numel())
    mid = 0.5 * (t_starts + t_ends)
    wm = weights * mid
    w_before = _exclusive_sum(weights, ray, offsets).to(weights.dtype)
    wm_before = _exclusive_sum(wm, ray, offsets).to(weights.dtype)
    # sum_{j<i} w_i w_j (m_i - m_j), counted for both orders of each pair
    pairs = 2.0 * (wm * w_before - weights * wm_before)
    own = weights.square() * (t_ends - t_starts) / 3.0
    n = offsets.numel() - 1
    return torch.zeros(n, dtype=weights.dtype, device=weights.device).index_add(0, ray, pairs + own)


def distortion_reference(
    weights: torch.Tensor, t_starts: torch.Tensor, t_ends: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """`distortion` by its definition, O(S^2) per ray: the tests' yardstick."""
    out = []
    for r in range(offsets.numel() - 1):
        a, b = int(offsets[r]), int(offsets[r + 1])
        w, t0, t1 = weights[a:b], t_starts[a:b], t_ends[a:b]
        m = 0.5 * (t0 + t1)
        pairs = (w[:, None] * w[None, :] * (m[:, None] - m[None, :]).abs()).sum()
        out.append(pairs + (w.square() * (t1 - t0)).sum() / 3.0)
    if not out:
        return weights.new_zeros(0)
    return torch.stack(out)
