import pytest
import torch

import kernels


def sphere_grid(n_cascades=2, res=32):
    g = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=res, n_cascades=n_cascades)
    # The update jitters its probe points with the global RNG: seed it so every test sees the
    # same grid whatever ran before (a lattice midpoint one ulp from a cell face flips otherwise).
    torch.manual_seed(0)
    g.update(lambda x: 50.0 * ((x.norm(dim=-1) - 0.6).abs() < 0.15).float(), warmup=True)
    return g


def camera_rays(n=400, radius=3.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(n, 3, generator=gen)
    o = radius * o / o.norm(dim=-1, keepdim=True)
    d = torch.nn.functional.normalize(-o + 0.7 * torch.randn(n, 3, generator=gen), dim=-1)
    return o, d


def assert_same(a, b):
    assert torch.equal(a.counts, b.counts)
    assert torch.equal(a.offsets, b.offsets)
    assert torch.equal(a.ray_indices, b.ray_indices)
    torch.testing.assert_close(a.t_starts, b.t_starts, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a.t_ends, b.t_ends, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cone", [0.0, 0.02])
@pytest.mark.parametrize("stratified", [False, True])
def test_matches_reference(cpu_ext, cone, stratified):
    g = sphere_grid()
    o, d = camera_rays()
    kw = dict(render_step_size=0.01, cone_angle=cone, stratified=stratified, max_samples=300)
    a = kernels.march_rays(o, d, g, generator=torch.Generator().manual_seed(5), **kw)
    b = kernels.march_rays(
        o, d, g, generator=torch.Generator().manual_seed(5), backend="reference", **kw
    )
    assert a.n_samples > 1000
    assert_same(a, b)


def test_skipping_keeps_every_occupied_sample(cpu_ext):
    # Marching with the grid must give exactly the box-marched lattice filtered by occupancy:
    # the mips may skip empty space, never an occupied cell.
    g = sphere_grid(n_cascades=1)
    o, d = camera_rays(300)
    a = kernels.march_rays(o, d, g, render_step_size=0.01, max_samples=100000)
    full = kernels.march_rays(o, d, aabb=g.outer_aabb, render_step_size=0.01, max_samples=100000)
    keep = g.is_occupied(full.midpoints(o, d))
    assert a.n_samples == int(keep.sum()) and a.n_samples < full.n_samples / 2
    assert torch.equal(a.ray_indices, full.ray_indices[keep])
    torch.testing.assert_close(a.t_starts, full.t_starts[keep], rtol=0, atol=2e-4)
    assert g.is_occupied(a.midpoints(o, d)).all()


def test_packed_layout_and_limits(cpu_ext):
    g = sphere_grid()
    o, d = camera_rays(200)
    s = kernels.march_rays(o, d, g, render_step_size=0.005, max_samples=17, near=0.5, far=4.0)
    assert s.counts.max() <= 17
    assert torch.equal(s.offsets[1:] - s.offsets[:-1], s.counts)
    assert torch.equal(s.ray_indices, torch.repeat_interleave(torch.arange(200), s.counts))
    assert (s.t_ends > s.t_starts).all() and (s.t_starts >= 0.5).all()
    same_ray = s.ray_indices[1:] == s.ray_indices[:-1]
    assert (s.t_starts[1:][same_ray] >= s.t_ends[:-1][same_ray] - 1e-6).all()


def test_one_pass_and_two_pass_marches_agree(cpu_ext):
    # The CPU marches in one pass into per-block buffers sized by the most samples a ray can
    # get; when that bound is huge (a step far finer than the box, with a large max_samples) it
    # counts first and fills after. Both must give the same samples: a window of the rays keeps
    # the count small whatever max_samples allows.
    g = sphere_grid()
    o, d = camera_rays(50)
    kw = dict(render_step_size=2e-6, near=2.4, far=2.41)
    one = kernels.march_rays(o, d, g, max_samples=10_000, **kw)
    two = kernels.march_rays(o, d, g, max_samples=1 << 21, **kw)
    assert one.n_samples > 50_000 and one.counts.max() < 10_000
    assert torch.equal(one.counts, two.counts) and torch.equal(one.ray_indices, two.ray_indices)
    assert torch.equal(one.t_starts, two.t_starts) and torch.equal(one.t_ends, two.t_ends)


def test_rays_that_miss_and_empty_grid(cpu_ext):
    o = torch.tensor([[5.0, 5.0, 5.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]])
    d = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -1.0]])  # away, away, through
    for backend in ("ext", "reference"):
        s = kernels.march_rays(
            o, d, aabb=[-1, -1, -1, 1, 1, 1], render_step_size=0.1, backend=backend
        )
        assert s.counts.tolist() == [0, 0, 20]
    g = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=16)
    g.density.zero_()
    g.binarize()
    for backend in ("ext", "reference"):
        s = kernels.march_rays(o, d, g, render_step_size=0.01, backend=backend)
        assert s.n_samples == 0 and s.offsets.tolist() == [0, 0, 0, 0]
    rgb, depth, opacity = kernels.composite(
        torch.zeros(0),
        torch.zeros(0, 3),
        s.t_starts,
        s.t_ends,
        s.ray_indices,
        3,
        background=1.0,
        offsets=s.offsets,
    )
    assert (rgb == 1).all() and (opacity == 0).all()


def test_bad_arguments():
    o = torch.zeros(4, 3)
    with pytest.raises(ValueError):
        kernels.march_rays(o, torch.zeros(4, 2), aabb=[-1, -1, -1, 1, 1, 1])
    with pytest.raises(ValueError):
        kernels.march_rays(o, o)
    with pytest.raises(ValueError):
        kernels.march_rays(o, o, aabb=[-1, -1, -1, 1, 1, 1], render_step_size=0.0)
