"""A point cloud of a nerf job, as nerfstudio's `ns-export pointcloud` makes one: rays through
random pixels of the training photos, one point per ray at the rendered depth where the ray is
opaque, coloured with the rendered colour."""

from __future__ import annotations

import torch

from worker.exports.common import ExportError, bounds, point_cloud_ply, to_world
from worker.nerf.rendering import render_image

# Rays whose accumulated opacity is below this have no single surface to put a point on.
MIN_OPACITY = 0.95
# Rays cast per wanted point: background rays and semi-transparent ones give no point.
RAYS_PER_POINT = 3
SEED = 0


def nerf_point_cloud(model, dataset, n_points: int):
    """(PLY bytes, stats) from a worker.scene.dataset.Dataset of the training split."""
    gen = torch.Generator().manual_seed(SEED)
    n_rays = min(RAYS_PER_POINT * n_points, max(dataset.n_pixels, n_points))
    idx = torch.randint(0, dataset.n_pixels, (n_rays,), generator=gen)
    o, d, _ = dataset.rays_of(idx)
    o, d = o.to(model.device), d.to(model.device)
    black = torch.zeros(3, device=model.device)
    rgb, depth, alpha, _ = render_image(
        model.field,
        model.grid,
        o,
        d,
        black,
        step=model.step_size,
        cone_angle=model.cone_angle,
        max_samples=model.config.max_samples_per_ray,
        alpha_threshold=model.config.alpha_threshold,
        max_step=model.max_step,
        near=model.config.near_distance,
    )
    hit = (alpha >= MIN_OPACITY) & (depth > 0)
    if not bool(hit.any()):
        raise ExportError("no training ray meets an opaque surface; the field has no points")
    pts = (o[hit] + d[hit] * depth[hit, None]).double().cpu().numpy()[:n_points]
    colors = (rgb[hit] / alpha[hit, None]).clamp(0, 1).double().cpu().numpy()[:n_points]
    pts = to_world(pts, model.normalization)
    return point_cloud_ply(pts, colors), {
        "points": int(len(pts)),
        "rays": int(n_rays),
        "bounds": bounds(pts),
    }
