"""Bookkeeping of marching in rounds over packed samples (worker/nerf/rendering.py): culling a
round's samples by the transmittance each ray has left, and moving rows into packed order.

Both are compiled for the CPU, where a round's dozen small tensor ops cost more than the work
they do; elsewhere (CUDA) the pure-torch references run, which are fast on a GPU.
"""

from __future__ import annotations

import torch

from . import _ext
from .hash_grid import _check_backend


def cull_round_reference(
    offsets, alive, sigma, t_starts, t_ends, tau, near, *, cap, tau_max, alpha_min
):
    """Pure-torch `cull_round`; the arguments are the same."""
    counts = offsets[1:] - offsets[:-1]
    ray = torch.repeat_interleave(
        torch.arange(alive.numel(), device=alive.device), counts, output_size=sigma.numel()
    )
    ri = alive.index_select(0, ray)
    dt = (sigma * (t_ends - t_starts)).double()
    cs = torch.cumsum(dt, 0)
    # Depth before each sample: its ray's earlier rounds plus the samples before it in this one.
    before = torch.cat([cs.new_zeros(1), cs])[offsets[:-1]].index_select(0, ray)
    keep = cs - dt - before + tau.index_select(0, ri) <= tau_max
    if alpha_min > 0:
        keep &= (1.0 - torch.exp(-dt)) >= alpha_min
    tau.index_add_(0, ri, dt)
    last = (offsets[1:] - 1).clamp_min(0)
    t_last = t_ends.index_select(0, last) if t_ends.numel() else near.index_select(0, alive)
    near.index_copy_(0, alive, torch.where(counts > 0, t_last, near.index_select(0, alive)))
    go = (counts == cap) & (tau.index_select(0, alive) <= tau_max)
    return keep, go


def cull_round(
    offsets: torch.Tensor,
    alive: torch.Tensor,
    sigma: torch.Tensor,
    t_starts: torch.Tensor,
    t_ends: torch.Tensor,
    tau: torch.Tensor,
    near: torch.Tensor,
    *,
    cap: int,
    tau_max: float,
    alpha_min: float = 0.0,
    backend: str = "ext",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One marching round's samples culled ray by ray, each ray's optical depth carried on from
    its earlier rounds (nerfacc's visibility test over packed samples, in pieces).

    Args:
        offsets: (A + 1,) int64: live ray a owns the round's samples [offsets[a], offsets[a + 1]).
        alive: (A,) int64: the live rays' indices into tau and near.
        sigma, t_starts, t_ends: (S,) float32 densities and intervals of the round's samples.
        tau: (N,) float64 optical depth of every ray before this round; advanced in place by
            sigma * dt (rounded to float32 first) of all its samples.
        near: (N,) float32 where each ray's marching resumes; set in place to the end of its last
            sample in the round.
        cap: the round's samples per ray: a ray with fewer has left the box.
        tau_max: a sample with more depth than this before it is hidden (transmittance below
            exp(-tau_max)).
        alpha_min: also cull samples whose own alpha is below this (0: none).
        backend: "ext" (compiled on the CPU, the reference elsewhere) or "reference".

    Returns:
        keep (S,) bool: the samples still seen; go (A,) bool: the rays that filled the round and
        still see through, to march on.
    """
    _check_backend(backend)
    args = (offsets, alive, sigma, t_starts, t_ends, tau, near)
    if backend == "reference" or sigma.device.type != "cpu":
        return cull_round_reference(*args, cap=cap, tau_max=tau_max, alpha_min=alpha_min)
    keep, go = _ext.load_cpu().cull_round(*args, int(cap), float(tau_max), float(alpha_min))
    return keep, go


def move_rows(
    dst: torch.Tensor,
    dest: torch.Tensor,
    src: torch.Tensor,
    idx: torch.Tensor,
    *,
    backend: str = "ext",
) -> torch.Tensor:
    """dst[dest[j]] = src[idx[j]] for every j: rows gathered and scattered in one pass (the
    reference, index_select then index_copy_, copies them twice).

    Args:
        dst: (N,) or (N, C), written in place; src: (M,) or (M, C) of dst's dtype.
        dest: (K,) int64 rows of dst (distinct, or the last write wins in no set order);
            idx: (K,) int64 rows of src.
        backend: "ext" (compiled on the CPU, the reference elsewhere) or "reference".

    Returns:
        dst.
    """
    _check_backend(backend)
    if backend == "reference" or src.device.type != "cpu":
        return dst.index_copy_(0, dest, src.index_select(0, idx))
    _ext.load_cpu().move_rows(dst, dest, src, idx)
    return dst
