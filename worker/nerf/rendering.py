"""Volume rendering of packed samples: march the occupancy grid, cull hidden samples, composite.

Culling (nerfacc's estimator trick): a gradient-free density pass over the marched samples finds
those behind an opaque surface (transmittance < 1e-4) or in empty space (alpha below a
threshold); only the rest go through the full network, with gradients when training. Inside
solid objects the grid is occupied, so without this most samples would be wasted. Rays are
marched in rounds of growing length, and a ray whose transmittance has run out is not marched
further (instant-ngp's compacted marching), so samples behind a surface are mostly never made.
The hash-grid features of that pass are kept and reused for the kept samples, so no sample is
encoded twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels import OccupancyGrid, composite, cull_round, march_rays, move_rows

EARLY_STOP_T = 1e-4
# Samples encoded per call: their features (16 MB) stay under worker.memory's mmap threshold, so
# the heap's pages are reused from one call to the next.
SAMPLE_CHUNK = 1 << 17
# Samples per ray in the first marching round; each later round marches twice as many. Most rays
# of a trained field end within a few samples of their surface, so short rounds waste little.
FIRST_ROUND = 4


@dataclass
class RenderStats:
    n_rays: int = 0
    marched: int = 0  # samples the grid let through
    # samples that reached the colour network; a 0-dim device tensor from a training batch on
    # a GPU (render_rays), which the trainer reads back with its loss
    kept: int | torch.Tensor = 0

    def add(self, other: RenderStats) -> None:
        self.n_rays += other.n_rays
        self.marched += other.marched
        self.kept += other.kept


@dataclass
class Samples:
    """The kept samples of a batch of rays, packed by ray and sorted by t within each."""

    sigma: torch.Tensor  # (S,) densities
    t_starts: torch.Tensor  # (S,)
    t_ends: torch.Tensor  # (S,)
    offsets: torch.Tensor  # (N + 1,) int64: ray r owns samples [offsets[r], offsets[r + 1])


def _per_ray(ray_indices: torch.Tensor, n_rays: int) -> torch.Tensor:
    """Samples per ray (n_rays,) int64. Not bincount: on a GPU its output size waits for the
    largest index (a host synchronisation), where n_rays is known."""
    counts = torch.zeros(n_rays, dtype=torch.int64, device=ray_indices.device)
    return counts.index_add_(0, ray_indices, torch.ones_like(ray_indices))


def _offsets(ray_indices: torch.Tensor, n_rays: int) -> torch.Tensor:
    counts = _per_ray(ray_indices, n_rays)
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
def march_visible(
    field,
    grid: OccupancyGrid,
    rays_o: torch.Tensor,
    rays_d: torch.Tensor,
    *,
    step: float,
    cone_angle: float = 0.0,
    max_step: float = 1e10,
    max_samples: int = 1024,
    stratified: bool = False,
    alpha_threshold: float = 0.0,
    near: float = 0.0,
):
    """The samples a ray still sees, marched in rounds until each ray is opaque or leaves the box.

    A round continues a ray from the end of its last sample, so the samples are those one march
    would give; only a ray's samples past the point where its transmittance fell below
    EARLY_STOP_T are never marched (nor encoded).

    Args:
        rays_o, rays_d: (N, 3) origins and unit directions.
        step, cone_angle, max_step, max_samples, stratified: as `march_rays` (max_samples over
            all rounds).
        alpha_threshold: also drop samples with alpha below this.
        near: where every ray starts (camera rays: the near plane's distance).

    Returns:
        (ray_indices (S,) int64, t_starts (S,), t_ends (S,), features (S, n_features) without
        gradients, n_marched): the kept samples sorted by ray, then t.
    """
    n = rays_o.shape[0]
    dev = rays_o.device
    tau_max = -torch.log(torch.tensor(EARLY_STOP_T, dtype=torch.float64)).item()
    alive = torch.arange(n, device=dev)
    near = torch.full((n,), float(near), device=dev)
    tau_total = torch.zeros(n, dtype=torch.float64, device=dev)
    # Each round's kept samples (sorted by ray): ray, t0, t1, the round's features, kept indices.
    parts: list[tuple[torch.Tensor, ...]] = []
    marched, k, first, used = 0, FIRST_ROUND, True, 0
    while alive.numel() and used < max_samples:
        # Every live ray filled all earlier rounds, so all have `used` samples.
        cap = min(k, max_samples - used)
        s = march_rays(
            rays_o.index_select(0, alive),
            rays_d.index_select(0, alive),
            grid,
            near=near.index_select(0, alive),
            render_step_size=step,
            cone_angle=cone_angle,
            max_step=max_step,
            max_samples=cap,
            stratified=stratified and first,
        )
        first = False
        m = s.t_starts.numel()
        if not m:
            break
        marched += m
        ri = alive.index_select(0, s.ray_indices)
        t0, t1 = s.t_starts, s.t_ends
        t_mid = (0.5 * (t0 + t1))[:, None]
        pos = torch.addcmul(rays_o.index_select(0, ri), t_mid, rays_d.index_select(0, ri))
        enc, sigma = _encode_chunked(field, pos)
        keep, go = cull_round(
            s.offsets,
            alive,
            sigma,
            t0,
            t1,
            tau_total,
            near,
            cap=cap,
            tau_max=tau_max,
            alpha_min=alpha_threshold,
            backend=field.backend,
        )
        idx = keep.nonzero().squeeze(1)
        parts.append(
            (ri.index_select(0, idx), t0.index_select(0, idx), t1.index_select(0, idx), enc, idx)
        )
        # A ray goes on only if it filled this round (it may have more samples) and still sees
        # through.
        alive = alive[go]
        used += cap
        k *= 2
    if not parts:
        z = torch.zeros(0, device=dev)
        return torch.zeros(0, dtype=torch.int64, device=dev), z, z, None, marched
    return (*_pack_rounds(parts, n, field.backend), marched)


def _pack_rounds(parts, n_rays: int, backend: str):
    """The rounds' kept samples in ray order, then t (each ray's rounds follow one another), each
    copied once to where it belongs instead of concatenated and then sorted."""
    if len(parts) == 1:
        ri, t0, t1, enc, idx = parts[0]
        return ri, t0, t1, enc.index_select(0, idx)
    # (rounds, n_rays): how many samples each ray kept in each round
    counts = torch.stack([_per_ray(p[0], n_rays) for p in parts])
    before = torch.cumsum(counts, 0) - counts  # a ray's samples in its earlier rounds
    total = counts.sum(0)
    ray_start = torch.cumsum(total, 0) - total
    n_kept = sum(p[0].numel() for p in parts)  # known on the host: no wait for the device
    ri = parts[0][0].new_empty(n_kept)
    t0 = parts[0][1].new_empty(n_kept)
    t1 = parts[0][1].new_empty(n_kept)
    enc = parts[0][3].new_empty(n_kept, parts[0][3].shape[1])
    for r, (kri, kt0, kt1, renc, idx) in enumerate(parts):
        # Sample j of the round is the (j - first of its ray in the round)-th of that ray here.
        first = torch.cumsum(counts[r], 0) - counts[r]
        rank = torch.arange(kri.numel(), device=kri.device) - first.index_select(0, kri)
        dest = (ray_start + before[r]).index_select(0, kri) + rank
        ri.index_copy_(0, dest, kri)
        t0.index_copy_(0, dest, kt0)
        t1.index_copy_(0, dest, kt1)
        move_rows(enc, dest, renc, idx, backend=backend)
    return ri, t0, t1, enc


class _NearGradScale(torch.autograd.Function):
    """Identity forward; the backward multiplies each sample's gradient by its scale."""

    @staticmethod
    def forward(ctx, sigma, rgb, scale):
        ctx.save_for_backward(scale)
        return sigma.view_as(sigma), rgb.view_as(rgb)

    @staticmethod
    def backward(ctx, g_sigma, g_rgb):
        (scale,) = ctx.saved_tensors
        return g_sigma * scale, g_rgb * scale[:, None], None


def scale_near_gradients(
    sigma: torch.Tensor, rgb: torch.Tensor, t_mid: torch.Tensor, distance: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples closer to their camera than `distance` pass back (t / distance)^2 of their
    gradient (Philip and Deschaintre, "Floaters No More", 2023; nerfstudio's
    `scale_gradients_by_distance_squared`).

    A cell near one camera is crossed by many of that camera's rays, so it gathers gradient
    faster than the far scene its pixels show and grows a floater that explains the photo; the
    rays' density falls as 1/t^2, which the scale undoes.

    Args:
        sigma: (S,) densities. rgb: (S, 3) colours. t_mid: (S,) distance of each sample along
            its unit ray. distance: where the scale reaches 1; 0 leaves the gradients alone.

    Example:
        >>> s, c = scale_near_gradients(sigma, rgb, 0.5 * (t0 + t1), 1.0)
    """
    if distance <= 0 or not torch.is_grad_enabled():
        return sigma, rgb
    scale = (t_mid.detach() / distance).square().clamp(max=1.0).to(sigma.dtype)
    return _NearGradScale.apply(sigma, rgb, scale)


def render_rays(
    field,
    grid: OccupancyGrid,
    rays_o: torch.Tensor,
    rays_d: torch.Tensor,
    background: torch.Tensor,
    *,
    step: float,
    cone_angle: float = 0.0,
    max_step: float = 1e10,
    max_samples: int = 1024,
    stratified: bool = False,
    alpha_threshold: float = 0.0,
    with_samples: bool = False,
    near: float = 0.0,
    grad_scale_distance: float = 0.0,
):
    """(rgb (N, 3), depth (N,) along the unit ray (0 where empty), opacity (N,), RenderStats),
    and with `with_samples` a fifth item: the kept samples as `Samples` (densities with their
    gradient, for regularisers over the samples such as `worker.nerf.losses.distortion`).

    `near`: where the rays start (camera rays: the near plane's distance from the camera).
    `grad_scale_distance`: samples nearer than this pass back less gradient
    (`scale_near_gradients`). Differentiable w.r.t. the field when called with grad enabled.
    """
    n = rays_o.shape[0]
    march = dict(
        step=step,
        cone_angle=cone_angle,
        max_step=max_step,
        max_samples=max_samples,
        stratified=stratified,
        alpha_threshold=alpha_threshold,
        near=near,
    )
    if rays_o.device.type != "cpu" and torch.is_grad_enabled():
        return _render_masked(
            field, grid, rays_o, rays_d, background, with_samples, march, grad_scale_distance
        )
    ri, t0, t1, enc, marched = march_visible(field, grid, rays_o, rays_d, **march)
    if ri.numel():
        t_mid = (0.5 * (t0 + t1))[:, None]
        pos = torch.addcmul(rays_o.index_select(0, ri), t_mid, rays_d.index_select(0, ri))
    kept = int(ri.numel())
    offsets = _offsets(ri, n)
    if kept:
        sigma, rgb = field(pos, rays_d.index_select(0, ri), enc=enc)
        sigma, rgb = scale_near_gradients(sigma, rgb, t_mid[:, 0], grad_scale_distance)
    else:
        sigma = torch.zeros(0, device=rays_o.device)
        rgb = torch.zeros(0, 3, device=rays_o.device)
    color, depth, opacity = composite(
        sigma, rgb, t0, t1, ri, n, background, offsets=offsets, backend=field.backend
    )
    stats = RenderStats(n, marched, kept)
    if with_samples:
        return color, depth, opacity, stats, Samples(sigma, t0, t1, offsets)
    return color, depth, opacity, stats


@torch.no_grad()
def march_masked(
    field,
    grid: OccupancyGrid,
    rays_o: torch.Tensor,
    rays_d: torch.Tensor,
    *,
    step: float,
    cone_angle: float = 0.0,
    max_step: float = 1e10,
    max_samples: int = 1024,
    stratified: bool = False,
    alpha_threshold: float = 0.0,
    near: float = 0.0,
):
    """Every ray marched once to its end, the hidden samples flagged rather than dropped.

    `march_visible`'s rounds and compaction wait for the device at every round (its sample
    count, the kept indices): on a GPU that is a dozen host synchronisations a step. Here the
    march's own sample count is the one wait; the samples `march_visible` would drop are those
    `keep` is False for, and a fixed-size mask replaces the compaction. Arguments as
    `march_visible`.

    Returns:
        (ray_indices (S,) int64, t_starts (S,), t_ends (S,), offsets (N + 1,) int64, features
        (S, n_features) without gradients, keep (S,) bool): every marched sample, sorted by ray,
        then t.
    """
    n = rays_o.shape[0]
    dev = rays_o.device
    tau_max = -torch.log(torch.tensor(EARLY_STOP_T, dtype=torch.float64)).item()
    near = torch.full((n,), float(near), device=dev)
    s = march_rays(
        rays_o,
        rays_d,
        grid,
        near=near,
        render_step_size=step,
        cone_angle=cone_angle,
        max_step=max_step,
        max_samples=max_samples,
        stratified=stratified,
    )
    ri, t0, t1 = s.ray_indices, s.t_starts, s.t_ends
    t_mid = (0.5 * (t0 + t1))[:, None]
    pos = torch.addcmul(rays_o.index_select(0, ri), t_mid, rays_d.index_select(0, ri))
    enc, sigma = _encode_chunked(field, pos)
    keep, _ = cull_round(
        s.offsets,
        torch.arange(n, device=dev),
        sigma,
        t0,
        t1,
        torch.zeros(n, dtype=torch.float64, device=dev),
        near,
        cap=max_samples,
        tau_max=tau_max,
        alpha_min=alpha_threshold,
        backend=field.backend,
    )
    return ri, t0, t1, s.offsets, enc, keep


def _render_masked(
    field, grid, rays_o, rays_d, background, with_samples, march, grad_scale_distance=0.0
):
    # Training on a GPU: the network runs over every marched sample and the hidden ones get zero
    # density, so they add nothing to the colour, depth, opacity or any gradient: the result is
    # that of the compacted samples, with no host synchronisation but the march's.
    n = rays_o.shape[0]
    ri, t0, t1, offsets, enc, keep = march_masked(field, grid, rays_o, rays_d, **march)
    marched = int(ri.numel())
    if marched:
        t_mid = (0.5 * (t0 + t1))[:, None]
        pos = torch.addcmul(rays_o.index_select(0, ri), t_mid, rays_d.index_select(0, ri))
        sigma, rgb = field(pos, rays_d.index_select(0, ri), enc=enc)
        sigma = torch.where(keep, sigma, torch.zeros_like(sigma))
        sigma, rgb = scale_near_gradients(sigma, rgb, t_mid[:, 0], grad_scale_distance)
    else:
        sigma = torch.zeros(0, device=rays_o.device)
        rgb = torch.zeros(0, 3, device=rays_o.device)
    color, depth, opacity = composite(
        sigma, rgb, t0, t1, ri, n, background, offsets=offsets, backend=field.backend
    )
    # kept: a 0-dim device tensor here, read with the step's loss (one wait, not two)
    stats = RenderStats(n, marched, keep.sum())
    if with_samples:
        return color, depth, opacity, stats, Samples(sigma, t0, t1, offsets)
    return color, depth, opacity, stats


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
    max_step: float = 1e10,
    alpha_threshold: float = 0.0,
    near: float = 0.0,
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
            max_step=max_step,
            max_samples=max_samples,
            alpha_threshold=alpha_threshold,
            near=near,
        )
        rgbs.append(c)
        depths.append(torch.where(a > 1e-6, d / a.clamp_min(1e-6), torch.zeros_like(d)))
        alphas.append(a)
        stats.add(st)
    return torch.cat(rgbs), torch.cat(depths), torch.cat(alphas), stats
