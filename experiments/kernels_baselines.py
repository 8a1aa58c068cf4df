"""Tuned pure-torch baselines for the kernel benchmark (experiments/kernels_bench.py).

The references in kernels/ are written for clarity and exactness, and are slow for reasons that
have nothing to do with the op: the hash grid's backward is a 2-D `index_select` backward per
level, compositing takes an fp64 cumsum plus an extra prefix pass, and the marcher advances all
rays one step per Python iteration. These versions are what a careful pure-torch implementation
would do instead, so the benchmark can print the compiled kernels' ratio against both:

- `hash_grid_tuned`: corners vectorised per level, and a backward that scatters into the flat table
  with one 1-D `index_add_` per level (recomputing indices instead of storing them);
- `composite_tuned`: fp32 throughout, samples scattered into a padded (n_rays, max_samples) block
  so the exclusive cumsum is per ray (no cancellation against a global total), no extra pass;
- `march_tuned`: constant steps only; every lattice point of every ray generated at once (rays in
  chunks), occupancy tested in one vectorised lookup, the first max_samples kept per ray;
- `nerf_mlp_tuned`: the NeRF field's MLPs as NerfField ran them before kernels.nerf_mlp, one
  nn.Linear (a oneDNN/MKL product over all rows) and one in-place ReLU per layer.

tests/kernels/test_baselines.py holds each against its reference.
"""

from __future__ import annotations

import math

import torch

from kernels.composite import EARLY_STOP_T
from kernels.hash_grid import PRIMES
from kernels.marching import PackedSamples
from kernels.mlp import trunc_exp


# ------------------------------------------------------------------------------------ hash grid
def _level_rows(x, scale, res, rows, offset, hashed, corners):
    """Flat table rows (N, 2^D) and weights (N, 2^D) of one level."""
    pos = x * scale + 0.5
    fl = torch.floor(pos)
    frac = pos - fl
    g = fl.long()[:, None, :] + corners[None]  # (N, C, D)
    w = torch.where(corners[None].bool(), frac[:, None, :], 1.0 - frac[:, None, :]).prod(-1)
    d = x.shape[1]
    if hashed:
        h = g[..., 0] * PRIMES[0]
        for k in range(1, d):
            h = h ^ ((g[..., k] * PRIMES[k]) & 0xFFFFFFFF)
        idx = h & (rows - 1)
    else:
        idx = g[..., 0]
        stride = res
        for k in range(1, d):
            idx = idx + g[..., k] * stride
            stride *= res
    return idx + offset, w


class _TunedHashGrid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, table, layout):
        ctx.save_for_backward(x)
        ctx.layout, ctx.shape = layout, table.shape
        n, f = x.shape[0], table.shape[1]
        feat = torch.arange(f, device=x.device)
        flat = table.reshape(-1)
        outs = []
        for idx, w in _levels(x, layout):
            rows = flat[(idx[..., None] * f + feat)]  # (N, C, F), one 1-D gather
            outs.append((w[..., None] * rows).sum(1))
        return torch.cat(outs, 1) if outs else x.new_zeros(n, 0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        rows, f = ctx.shape
        feat = torch.arange(f, device=x.device)
        g_flat = grad.new_zeros(rows * f)
        for level, (idx, w) in enumerate(_levels(x, ctx.layout)):
            g = grad[:, level * f : (level + 1) * f]
            contrib = w[..., None] * g[:, None, :]  # (N, C, F)
            g_flat.index_add_(0, (idx[..., None] * f + feat).reshape(-1), contrib.reshape(-1))
        return None, g_flat.view(rows, f), None


def _levels(x, layout):
    scales, resolution, offsets, hashed = layout
    d = x.shape[1]
    corners = torch.tensor(
        [[(c >> k) & 1 for k in range(d)] for c in range(1 << d)], device=x.device
    )
    xc = torch.nan_to_num(x, nan=0.0).clamp(0.0, 1.0)
    for level in range(len(resolution)):
        scale = torch.tensor(float(scales[level]), dtype=torch.float32).to(x.dtype).to(x.device)
        rows = int(offsets[level + 1] - offsets[level])
        yield _level_rows(
            xc,
            scale,
            int(resolution[level]),
            rows,
            int(offsets[level]),
            bool(hashed[level]),
            corners,
        )


def hash_grid_tuned(x: torch.Tensor, grid) -> torch.Tensor:
    """Encode x (N, D) with `grid` (a kernels.HashGrid) -> (N, n_levels * F), grads to its table."""
    layout = (grid.scales, grid.resolution, grid.offsets, grid.hashed)
    return _TunedHashGrid.apply(x.to(grid.params.dtype), grid.params, layout)


# ------------------------------------------------------------------------------------ composite
def composite_tuned(sigmas, rgbs, t_starts, t_ends, ray_indices, n_rays, offsets, background=None):
    """Same outputs as kernels.composite (rgb (n_rays, 3), depth, opacity), fp32 pure torch."""
    ri = ray_indices.long()
    counts = offsets[1:] - offsets[:-1]
    width = int(counts.max()) if n_rays and ri.numel() else 1
    slot = ri * width + (torch.arange(ri.numel(), device=ri.device) - offsets[:-1][ri])
    tau = sigmas * (t_ends - t_starts)
    padded = tau.new_zeros(n_rays * width).index_copy(0, slot, tau).view(n_rays, width)
    excl = (torch.cumsum(padded, 1) - padded).reshape(-1)[slot]
    trans = torch.exp(-excl)
    w = torch.where(trans >= EARLY_STOP_T, trans * -torch.expm1(-tau), torch.zeros_like(tau))
    rgb = rgbs.new_zeros(n_rays, 3).index_add(0, ri, w[:, None] * rgbs)
    depth = w.new_zeros(n_rays).index_add(0, ri, w * 0.5 * (t_starts + t_ends))
    opacity = w.new_zeros(n_rays).index_add(0, ri, w)
    if background is not None:
        bg = torch.as_tensor(background, dtype=rgb.dtype, device=rgb.device)
        rgb = rgb + (1.0 - opacity)[:, None] * bg
    return rgb, depth, opacity


# ------------------------------------------------------------------------------------ marching
def _ray_box(o, d, box):
    lo = torch.tensor(box[:3], device=o.device)
    hi = torch.tensor(box[3:], device=o.device)
    safe = torch.where(d == 0, torch.ones_like(d), d)
    a, b = (lo - o) / safe, (hi - o) / safe
    inf = torch.full_like(a, math.inf)
    tn = torch.where(d == 0, -inf, torch.minimum(a, b)).max(1).values
    tf = torch.where(d == 0, inf, torch.maximum(a, b)).min(1).values
    miss = ((d == 0) & ((o < lo) | (o > hi))).any(1)
    return tn, tf, ~miss & (tn <= tf)


def march_tuned(rays_o, rays_d, grid, step, max_samples=1024, chunk=2048) -> PackedSamples:
    """Constant-step marching through `grid` (kernels.OccupancyGrid), no jitter, near 0."""
    tmin, tmax, hit = _ray_box(rays_o, rays_d, grid.outer_aabb)
    tmin = tmin.clamp(min=0.0)
    alive = hit & (tmin < tmax)
    steps = torch.where(alive, torch.ceil((tmax - tmin) / step), torch.zeros_like(tmin)).long()
    out_r, out_t = [], []
    for s in range(0, rays_o.shape[0], chunk):
        e = min(s + chunk, rays_o.shape[0])
        k_max = int(steps[s:e].max()) if e > s else 0
        if k_max == 0:
            continue
        k = torch.arange(k_max, device=rays_o.device, dtype=torch.float32)
        t = tmin[s:e, None] + k * step  # (n, K)
        tm = t + 0.5 * step
        valid = alive[s:e, None] & (tm < tmax[s:e, None])
        pos = rays_o[s:e, None, :] + tm[..., None] * rays_d[s:e, None, :]
        keep = torch.zeros_like(valid)
        keep[valid] = grid.is_occupied(pos[valid], backend="reference")
        keep &= torch.cumsum(keep, 1) <= max_samples
        r, kk = keep.nonzero(as_tuple=True)  # row-major: by ray, then by t
        out_r.append(r + s)
        out_t.append(t[r, kk])
    dev = rays_o.device
    ri = torch.cat(out_r) if out_r else torch.zeros(0, dtype=torch.long, device=dev)
    t0 = torch.cat(out_t) if out_t else torch.zeros(0, device=dev)
    counts = torch.bincount(ri, minlength=rays_o.shape[0])
    offsets = torch.zeros(rays_o.shape[0] + 1, dtype=torch.long, device=dev)
    torch.cumsum(counts, 0, out=offsets[1:])
    return PackedSamples(ri, t0, t0 + step, offsets, counts)


# ------------------------------------------------------------------------------------ NeRF MLPs
def nerf_mlp_tuned(enc, density_net, sh=None, color_net=None, density_shift=1.0):
    """kernels.nerf_mlp over nn.Sequential networks (nn.Linear, nn.ReLU(inplace=True)) -> sigma
    (N,), rgb (N, 3) or None without sh."""
    h = density_net(enc)
    sigma = trunc_exp(h[:, 0] - density_shift)
    if sh is None:
        return sigma, None
    return sigma, torch.sigmoid(color_net(torch.cat([sh, h[:, 1:]], dim=1)))
