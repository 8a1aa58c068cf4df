"""Ray marching through an occupancy grid (or a plain box) into packed samples."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from . import _ext
from .hash_grid import _check_backend
from .occupancy import OccupancyGrid, locate_reference, occupied_at_reference


class PackedSamples(NamedTuple):
    """Samples of all rays, packed: ray r owns [offsets[r], offsets[r+1]); sorted by ray, then t."""

    ray_indices: torch.Tensor  # (S,) int64
    t_starts: torch.Tensor  # (S,) float32
    t_ends: torch.Tensor  # (S,) float32
    offsets: torch.Tensor  # (n_rays + 1,) int64
    counts: torch.Tensor  # (n_rays,) int64

    @property
    def n_samples(self) -> int:
        return self.t_starts.numel()

    def midpoints(self, rays_o: torch.Tensor, rays_d: torch.Tensor) -> torch.Tensor:
        """World positions of the interval midpoints (S, 3)."""
        t = (0.5 * (self.t_starts + self.t_ends))[:, None]
        return rays_o[self.ray_indices] + t * rays_d[self.ray_indices]


def _per_ray(v, n, device):
    t = torch.as_tensor(v, dtype=torch.float32, device=device)
    return t.expand(n).contiguous() if t.dim() == 0 else t.reshape(n).contiguous()


def march_rays(
    rays_o: torch.Tensor,
    rays_d: torch.Tensor,
    grid: OccupancyGrid | None = None,
    *,
    aabb=None,
    near=0.0,
    far=1e10,
    render_step_size: float | None = None,
    cone_angle: float = 0.0,
    max_step: float = 1e10,
    max_samples: int = 1024,
    stratified: bool = False,
    generator: torch.Generator | None = None,
    backend: str | None = None,
) -> PackedSamples:
    """March rays through a box, skipping the grid's empty cells, into packed samples.

    Occupancy is tested at each interval's midpoint; an empty cell is skipped at the coarsest
    empty mip around it, in whole steps, so samples stay on one lattice along the ray.

    Args:
        rays_o: (N, 3) origins (cast to float32).
        rays_d: (N, 3) directions; t is in units of |rays_d|.
        grid: an OccupancyGrid, or None to march `aabb` without skipping.
        aabb: [xmin, ymin, zmin, xmax, ymax, zmax]; default the grid's outer cascade box, and
            always intersected with it when a grid is given.
        near: scalar or (N,) start of each ray.
        far: scalar or (N,) end of each ray.
        render_step_size: step length; default the grid's step size, or sqrt(3) * side / 1024.
        cone_angle: 0 for constant steps, else dt = clamp(t * cone_angle, step, max_step).
        max_step: the largest step with a cone angle.
        max_samples: at most this many samples per ray (>= 1).
        stratified: shift each ray's start by U[0, 1) of a step (training).
        generator: torch.Generator for that jitter.
        backend: "ext" or "reference"; default the grid's backend, else "ext".

    Returns:
        PackedSamples: ray_indices (S,) int64, t_starts (S,) and t_ends (S,) float32, offsets
        (N + 1,) int64 and counts (N,) int64; sorted by ray, then t, with no padding.

    Raises:
        ValueError: mismatched ray shapes, no grid and no aabb, a step or max_samples out of range.
    """
    backend = backend or (grid.backend if grid is not None else "ext")
    _check_backend(backend)
    if rays_o.shape != rays_d.shape or rays_o.dim() != 2 or rays_o.shape[1] != 3:
        raise ValueError(
            f"rays_o and rays_d must both be (N, 3), got {tuple(rays_o.shape)} and {tuple(rays_d.shape)}"
        )
    if max_samples < 1:
        raise ValueError("max_samples must be >= 1")
    if grid is None and aabb is None:
        raise ValueError("march_rays needs a grid or an aabb")
    box = (
        torch.as_tensor(aabb if aabb is not None else grid.outer_aabb, dtype=torch.float32)
        .reshape(-1)
        .tolist()
    )
    if grid is not None:
        outer = grid.outer_aabb
        box = [max(a, b) for a, b in zip(box[:3], outer[:3])] + [
            min(a, b) for a, b in zip(box[3:], outer[3:])
        ]
    if len(box) != 6:
        raise ValueError("aabb must have 6 numbers")
    if render_step_size is None:
        render_step_size = (
            grid.step_size
            if grid is not None
            else math.sqrt(3) * max(box[3] - box[0], box[4] - box[1], box[5] - box[2]) / 1024
        )
    if not render_step_size > 0:
        raise ValueError("render_step_size must be > 0")
    n = rays_o.shape[0]
    dev = rays_o.device
    o = rays_o.float().contiguous()
    d = rays_d.float().contiguous()
    tn, tf = _per_ray(near, n, dev), _per_ray(far, n, dev)
    if stratified:
        jitter = (
            torch.rand(n, generator=generator, device=dev)
            if generator is None or generator.device == dev
            else torch.rand(n, generator=generator).to(dev)
        )
    else:
        jitter = torch.zeros(n, device=dev)
    args = (box, float(render_step_size), float(cone_angle), float(max_step), int(max_samples))
    if backend == "reference":
        return march_reference(o, d, tn, tf, jitter, *args, grid)
    mod = _ext.for_tensor(o)
    if grid is None:
        out = mod.march_rays(o, d, tn, tf, jitter, *args, None, 0, [0.0] * 3, [1.0] * 3)
    else:
        out = mod.march_rays(
            o, d, tn, tf, jitter, *args, grid.bits, grid.resolution, grid.center, grid.half
        )
    return PackedSamples(*out)


def _ray_aabb(o, d, box):
    lo = torch.tensor(box[:3], device=o.device)
    hi = torch.tensor(box[3:], device=o.device)
    zero = d == 0
    safe = torch.where(zero, torch.ones_like(d), d)
    a = (lo - o) / safe
    b = (hi - o) / safe
    inf = torch.full_like(a, math.inf)
    tn = torch.where(zero, -inf, torch.minimum(a, b)).max(1).values
    tf = torch.where(zero, inf, torch.maximum(a, b)).min(1).values
    miss = (zero & ((o < lo) | (o > hi))).any(1)
    return tn, tf, ~miss & (tn <= tf)


def march_reference(
    o, d, near, far, jitter, box, step, cone, max_step, max_samples, grid=None
) -> PackedSamples:
    """Pure-torch marching, all rays advanced together; mirrors kn::march_ray operation by operation."""
    n = o.shape[0]
    dev = o.device

    def calc_dt(t):
        if cone > 0:
            return torch.clamp(torch.clamp(t * cone, min=step), max=max_step)
        return torch.full_like(t, step)

    tmin, tmax, hit = _ray_aabb(o, d, box)
    tmin = torch.maximum(tmin, near)
    tmax = torch.minimum(tmax, far)
    alive = hit & (tmin < tmax)
    t = torch.where(alive, tmin + jitter * calc_dt(tmin), torch.zeros_like(tmin))
    count = torch.zeros(n, dtype=torch.long, device=dev)
    out_r, out_t0, out_t1 = [], [], []
    n_mips = int(math.log2(grid.resolution)) + 1 if grid is not None else 0
    t_last = torch.full_like(t, -math.inf)
    while True:
        alive = alive & (count < max_samples) & (t > t_last)  # as kn::march_ray: t must advance
        t_last = t.clone()
        idx = alive.nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        ti = t[idx]
        dt = calc_dt(ti)
        tm = ti + 0.5 * dt
        ok = tm < tmax[idx]
        alive[idx[~ok]] = False
        idx, ti, dt, tm = idx[ok], ti[ok], dt[ok], tm[ok]
        emit = torch.ones_like(idx, dtype=torch.bool)
        if grid is not None and idx.numel():
            oi, di = o[idx], d[idx]
            pos = oi + tm[:, None] * di
            inside, c, ijk = locate_reference(grid, pos)
            occ = inside & occupied_at_reference(grid, c, 0, ijk)
            emit = occ
            outside = ~inside
            t[idx[outside]] = ti[outside] + dt[outside]
            skip = inside & ~occ
            if skip.any():
                s_idx, s_t, s_dt, s_tm = idx[skip], ti[skip], dt[skip], tm[skip]
                s_c, s_ijk, s_o, s_d = c[skip], ijk[skip], oi[skip], di[skip]
                mip = torch.zeros_like(s_c)
                for m in range(1, n_mips):
                    grow = (mip == m - 1) & ~occupied_at_reference(grid, s_c, m, s_ijk)
                    mip = torch.where(grow, torch.full_like(mip, m), mip)
                te = _cell_exit(grid, s_c, mip, s_ijk, s_o, s_d)
                if cone > 0:
                    tt, ddt = s_t.clone(), s_dt.clone()
                    s_tmax = tmax[s_idx]
                    go = torch.ones_like(tt, dtype=torch.bool)
                    while go.any():
                        tt = torch.where(go, tt + ddt, tt)
                        ddt = torch.where(go, calc_dt(tt), ddt)
                        go = go & (tt + 0.5 * ddt < te) & (tt + 0.5 * ddt < s_tmax)
                    t[s_idx] = tt
                else:
                    k = torch.ceil((te - s_tm) / s_dt)
                    k = torch.where(k >= 1, k, torch.ones_like(k))
                    t[s_idx] = s_t + k * s_dt
        e_idx = idx[emit]
        out_r.append(e_idx)
        out_t0.append(ti[emit])
        out_t1.append(ti[emit] + dt[emit])
        count[e_idx] += 1
        t[e_idx] = ti[emit] + dt[emit]
    ri = torch.cat(out_r) if out_r else torch.zeros(0, dtype=torch.long, device=dev)
    t0 = torch.cat(out_t0) if out_t0 else torch.zeros(0, device=dev)
    t1 = torch.cat(out_t1) if out_t1 else torch.zeros(0, device=dev)
    order = torch.sort(ri, stable=True).indices  # emission order is increasing t within a ray
    counts = torch.bincount(ri, minlength=n)
    offsets = torch.zeros(n + 1, dtype=torch.long, device=dev)
    torch.cumsum(counts, 0, out=offsets[1:])
    return PackedSamples(ri[order], t0[order], t1[order], offsets, counts)


def _cell_exit(grid, c, mip, ijk, o, d):
    center = torch.tensor(grid.center, device=o.device)
    half = torch.tensor(grid.half, device=o.device)
    ext = half[None, :] * torch.pow(2.0, c.float())[:, None]
    size = (2.0 * ext / float(grid.resolution)) * torch.pow(2.0, mip.float())[:, None]
    lo = (center - ext) + (ijk >> mip[:, None]).float() * size
    bound = torch.where(d > 0, lo + size, lo)
    zero = d == 0
    te = (bound - o) / torch.where(zero, torch.ones_like(d), d)
    return torch.where(zero, torch.full_like(te, math.inf), te).min(1).values
