"""Volume rendering of packed samples: march the occupancy grid, cull hidden samples, composite.

Culling (nerfacc's estimator trick): one gradient-free density pass over every marched sample
finds those behind an opaque surface (transmittance < 1e-4) or in empty space (alpha below a
threshold); only the rest go through the full network, with gradients when training. Inside
solid objects the grid is occupied, so without this most samples would be wasted. The hash-grid
features of that pass are kept and reused for the kept samples, so no sample is encoded twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import OccupancyGrid, composite, march_rays

EARLY_STOP_T = 1e-4
SAMPLE_CHUNK = 1 << 18


@dataclass
class RenderStats:
    n_rays: int = 0
    marched: int = 0  # samples the grid let through
    kept: int = 0  # samples that reached the colour network

    def add(self, other: RenderStats) -> None:
        self.n_rays += other.n_rays
        self.marched += other.marched
        self.kept += other.kept


def _offsets(ray_indices: torch.Tensor, n_rays: int) -> torch.Tensor:
    counts = torch.bincount(ray_indices, minlength=n_rays)
    offsets = torch.zeros(n_rays + 1, dtype=torch.int64, device=ray_indices.device)
    torch.cumsum(counts, 0, out=offsets[1:])
    return offsets


@torch.no_grad()
def _encode_chunked(field, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hash features (S, n_features) and sigma (S,) of every sample, without gradients."""
    encs, sigmas = [], []
    for i in range(0, pos.shape[0], SAMPLE_CHUNK):
        enc = field.encode(pos[i : i + SAMPLE_CHUNK])
        encs.append(enc)
        sigmas.append(field.density_from(enc))
    if len(encs) == 1:
        return encs[0], sigmas[0]
    return torch.cat(encs), torch.cat(sigmas)


@torch.no_grad()
def visible(
    sigma: torch.Tensor,
    t0: torch.Tensor,
    t1: torch.Tensor,
    offsets: torch.Tensor,
    ray_indices: torch.Tensor,
    alpha_threshold: float = 0.0,
) -> torch.Tensor:
    """Mask of samples still seen from the camera (exclusive transmittance >= EARLY_STOP_T)."""
    tau = (sigma * (t1 - t0)).double()
    cs = torch.cumsum(tau, 0)
    # Segmented exclusive sum: subtract the running total at the start of each ray.
    before = torch.cat([cs.new_zeros(1), cs])[offsets[:-1]][ray_indices]
    excl = cs - tau - before
    keep = excl <= -torch.log(torch.tensor(EARLY_STOP_T, dtype=torch.float64))
    if alpha_threshold > 0:
        keep &= (1.0 - torch.exp(-tau)) >= alpha_threshold
    return keep


def render_rays(
    field,
    grid: OccupancyGrid,
    rays_o: torch.Tensor,
    rays_d: torch.Tensor,
    background: torch.Tensor,
    *,
    step: float,
    cone_angle: float = 0.0,
    max_samples: int = 1024,
    stratified: bool = False,
    alpha_threshold: float = 0.0,
):
    """(rgb (N, 3), depth (N,) along the unit ray (0 where empty), opacity (N,), RenderStats).

    Differentiable w.r.t. the field when called with grad enabled.
    """
    n = rays_o.shape[0]
    s = march_rays(
        rays_o,
        rays_d,
        grid,
        render_step_size=step,
        cone_angle=cone_angle,
        max_samples=max_samples,
        stratified=stratified,
    )
    ri, t0, t1 = s.ray_indices, s.t_starts, s.t_ends
    marched = int(ri.numel())
    enc = None
    if marched:
        t_mid = (0.5 * (t0 + t1))[:, None]
        pos = torch.addcmul(rays_o.index_select(0, ri), t_mid, rays_d.index_select(0, ri))
        enc, sigma_all = _encode_chunked(field, pos)
        keep = visible(sigma_all, t0, t1, s.offsets, ri, alpha_threshold).nonzero().squeeze(1)
        ri, t0, t1 = ri.index_select(0, keep), t0.index_select(0, keep), t1.index_select(0, keep)
        pos, enc = pos.index_select(0, keep), enc.index_select(0, keep)
    kept = int(ri.numel())
    offsets = _offsets(ri, n)
    if kept:
        sigma, rgb = field(pos, rays_d.index_select(0, ri), enc=enc)
    else:
        sigma = torch.zeros(0, device=rays_o.device)
        rgb = torch.zeros(0, 3, device=rays_o.device)
    color, depth, opacity = composite(
        sigma, rgb, t0, t1, ri, n, background, offsets=offsets, backend=field.backend
    )
    return color, depth, opacity, RenderStats(n, marched, kept)


@torch.no_grad()
def render_image(
    field,
    grid,
    rays_o,
    rays_d,
    background,
    *,
    step,
    cone_angle=0.0,
    max_samples=1024,
    chunk: int = 8192,
):
    """Chunked inference: rgb (N, 3), depth (N,) (expected distance of the visible surface, 0 = none),
    opacity (N,), stats. Memory is bounded by the chunk, whatever the image size."""
    rgbs, depths, alphas = [], [], []
    stats = RenderStats()
    per_ray = background.dim() == 2
    for i in range(0, rays_o.shape[0], chunk):
        bg = background[i : i + chunk] if per_ray else background
        c, d, a, st = render_rays(
            field,
            grid,
            rays_o[i : i + chunk],
            rays_d[i : i + chunk],
            bg,
            step=step,
            cone_angle=cone_angle,
            max_samples=max_samples,
        )
        rgbs.append(c)
        depths.append(torch.where(a > 1e-6, d / a.clamp_min(1e-6), torch.zeros_like(d)))
        alphas.append(a)
        stats.add(st)
    return torch.cat(rgbs), torch.cat(depths), torch.cat(alphas), stats
