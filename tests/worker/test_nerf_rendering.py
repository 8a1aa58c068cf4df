"""Marching in rounds with early termination keeps exactly the samples one full march + culling
keeps, and renders the same colours."""

import math

import pytest
import torch

from kernels import OccupancyGrid, march_rays
from worker.nerf.model import NerfField
from worker.nerf.rendering import EARLY_STOP_T, march_visible, render_rays, scale_near_gradients

CONFIG = {
    "n_levels": 8,
    "features_per_level": 2,
    "log2_hashmap_size": 15,
    "base_resolution": 8,
    "max_resolution": 128,
    "density_hidden": 32,
    "density_layers": 1,
    "geo_features": 7,
    "color_hidden": 32,
    "color_layers": 1,
    "sh_degree": 2,
    "mlp_precision": "float32",
}


def _field_and_grid():
    torch.manual_seed(3)
    field = NerfField(CONFIG)
    # A dense ball: rays through it become opaque after a few samples, others pass.
    with torch.no_grad():
        field.density_net[-1].bias[0] = 5.0
    grid = OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=16, step_size=2 * math.sqrt(3) / 128)
    ijk = torch.stack(torch.meshgrid(*[torch.arange(16)] * 3, indexing="ij"), -1).reshape(-1, 3)
    centre = (ijk.float() + 0.5) / 16 * 2 - 1
    inside = centre.norm(dim=1) < 0.6
    dense = torch.zeros(16**3)
    # morton order, as the grid stores cells
    from kernels.occupancy import morton3d

    dense[morton3d(ijk[:, 0], ijk[:, 1], ijk[:, 2])] = inside.float()
    grid.density.copy_(dense[None])
    grid.binarize(0.5)
    return field, grid


def _rays(n=300):
    g = torch.Generator().manual_seed(0)
    o = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=1) * 2.5
    target = (torch.rand(n, 3, generator=g) - 0.5) * 1.2
    return o, torch.nn.functional.normalize(target - o, dim=1)


def _one_march(field, grid, o, d, step, max_samples):
    """Reference: march everything, then cull by exclusive transmittance per ray in a loop."""
    s = march_rays(o, d, grid, render_step_size=step, max_samples=max_samples)
    pos = s.midpoints(o, d)
    with torch.no_grad():
        sigma = field.density(pos).double()
    keep = torch.zeros(s.n_samples, dtype=torch.bool)
    for r in range(o.shape[0]):
        a, b = int(s.offsets[r]), int(s.offsets[r + 1])
        acc = 0.0
        for i in range(a, b):
            keep[i] = math.exp(-acc) >= EARLY_STOP_T
            acc += float(sigma[i]) * float(s.t_ends[i] - s.t_starts[i])
    return s, keep


@pytest.mark.parametrize("max_samples", [7, 256])
def test_rounds_keep_the_samples_of_one_march(max_samples):
    field, grid = _field_and_grid()
    o, d = _rays()
    step = grid.step_size
    s, keep = _one_march(field, grid, o, d, step, max_samples)
    ri, t0, t1, enc, marched = march_visible(field, grid, o, d, step=step, max_samples=max_samples)
    assert torch.equal(ri, s.ray_indices[keep])
    assert torch.equal(t0, s.t_starts[keep]) and torch.equal(t1, s.t_ends[keep])
    assert torch.allclose(enc, field.encode(s.midpoints(o, d)[keep]), atol=1e-6)
    # Early termination: rays through the ball stop being marched, so fewer samples are made.
    assert keep.sum() <= marched <= s.n_samples
    if max_samples == 256:
        assert marched < s.n_samples


def test_render_rays_gradients_reach_the_kept_samples():
    field, grid = _field_and_grid()
    o, d = _rays(64)
    rgb, _, opacity, stats = render_rays(
        field, grid, o, d, torch.ones(3), step=grid.step_size, max_samples=256
    )
    assert stats.kept > 0 and stats.marched >= stats.kept
    rgb.sum().backward()
    assert field.color_net[0].weight.grad.abs().sum() > 0
    assert ((opacity > 0) & (opacity <= 1)).any()


def test_near_samples_pass_back_the_squared_share_of_their_gradient():
    sigma = torch.rand(5, requires_grad=True)
    rgb = torch.rand(5, 3, requires_grad=True)
    t = torch.tensor([0.1, 0.5, 1.0, 2.0, 3.0])
    s, c = scale_near_gradients(sigma, rgb, t, 2.0)
    assert torch.equal(s, sigma) and torch.equal(c, rgb)  # the render is unchanged
    (s.sum() + c.sum()).backward()
    want = (t / 2.0).square().clamp(max=1.0)
    assert torch.allclose(sigma.grad, want)
    assert torch.allclose(rgb.grad, want[:, None].expand(5, 3))


def test_render_rays_scales_the_gradient_of_samples_near_the_camera():
    field, grid = _field_and_grid()
    o, d = _rays(64)

    def grads(distance):
        field.zero_grad()
        rgb, _, _, _ = render_rays(
            field,
            grid,
            o,
            d,
            torch.ones(3),
            step=grid.step_size,
            max_samples=256,
            grad_scale_distance=distance,
        )
        rgb.sum().backward()
        return rgb.detach(), field.color_net[0].weight.grad.clone()

    rgb0, g0 = grads(0.0)
    rgb1, g1 = grads(100.0)  # every sample (t < 5) well inside: gradients shrink, the render not
    assert torch.equal(rgb0, rgb1)
    assert 0 < g1.abs().sum() < 0.01 * g0.abs().sum()
