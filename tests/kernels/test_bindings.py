"""Both bindings of each extension refuse the same bad arguments before any kernel runs.

Parametrised over every device this machine has, so scripts/gpu_check.sh runs the same checks
against the CUDA modules (including a second GPU, where present).
"""

import pytest
import torch

import kernels
from kernels import _ext

DEVICES = ["cpu"]
if torch.cuda.is_available():
    DEVICES.append("cuda")
    if torch.cuda.device_count() > 1:
        DEVICES.append("cuda:1")


def nerf(dev):
    return _ext.load(_ext.NERF, torch.device(dev).type)


def splat_mod(dev):
    return _ext.load(_ext.SPLAT, torch.device(dev).type)


def packed(dev, n_rays=5, per_ray=4, dtype=torch.float32):
    s = n_rays * per_ray
    g = torch.Generator().manual_seed(0)
    sig = (torch.rand(s, generator=g) * 5).to(dev, dtype)
    rgb = torch.rand(s, 3, generator=g).to(dev, dtype)
    t0 = (torch.arange(s) % per_ray * 0.1).to(dev, dtype)
    t1 = t0 + 0.1
    off = torch.arange(0, s + 1, per_ray, dtype=torch.int64, device=dev)
    return sig, rgb, t0, t1, off


@pytest.mark.parametrize("dev", DEVICES)
def test_half_precision_colours_are_refused_by_the_binding_and_cast_by_composite(dev):
    sig, rgb, t0, t1, off = packed(dev)
    with pytest.raises(ValueError, match="rgbs must be Float"):
        nerf(dev).composite_forward(sig, rgb.half(), t0, t1, off, 1e-4)
    ri = torch.repeat_interleave(torch.arange(5, device=dev), 4)
    ref = kernels.composite(sig, rgb, t0, t1, ri, 5, offsets=off)
    half = kernels.composite(sig, rgb.half(), t0, t1, ri, 5, offsets=off)
    for a, b in zip(half, ref):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)  # fp16 colours: ~3 digits


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize(
    "bad,match",
    [
        (lambda off: off[:-1].contiguous(), "end at 20"),  # a ray short: samples no ray owns
        (lambda off: off.flip(0).contiguous(), "start at 0"),
        (lambda off: torch.stack([off[0], off[2], off[1], *off[3:]]), "never decrease"),
        (lambda off: off.int(), "must be Long"),
    ],
)
def test_caller_offsets_are_validated(dev, bad, match):
    sig, rgb, t0, t1, off = packed(dev)
    with pytest.raises(ValueError, match=match):
        nerf(dev).composite_forward(sig, rgb, t0, t1, bad(off), 1e-4)
    g = torch.zeros(4, 3, device=dev)
    if match == "end at 20":
        with pytest.raises(ValueError, match=match):
            nerf(dev).composite_backward(
                sig, rgb, t0, t1, bad(off), 1e-4, g, g[:, 0].clone(), g[:, 0].clone()
            )


@pytest.mark.parametrize("dev", DEVICES)
def test_composite_sizes_dtypes_and_devices_are_checked(dev):
    m = nerf(dev)
    sig, rgb, t0, t1, off = packed(dev)
    with pytest.raises(ValueError, match="t_ends must have shape"):
        m.composite_forward(sig, rgb, t0, t1[:-1].contiguous(), off, 1e-4)
    with pytest.raises(ValueError, match="t_starts must be Float"):
        m.composite_forward(sig, rgb, t0.double(), t1, off, 1e-4)
    with pytest.raises(ValueError, match="rgbs must be contiguous"):
        m.composite_forward(sig, rgb.t().contiguous().t(), t0, t1, off, 1e-4)
    gr, gd = torch.zeros(5, 3, device=dev), torch.zeros(5, device=dev)
    with pytest.raises(ValueError, match="grad depth must have shape"):
        m.composite_backward(sig, rgb, t0, t1, off, 1e-4, gr, gd[:4].contiguous(), gd)
    if dev != "cpu":
        with pytest.raises(ValueError, match="must be on"):
            m.composite_forward(sig, rgb.cpu(), t0, t1, off, 1e-4)


@pytest.mark.parametrize("dev", DEVICES)
def test_hash_grid_table_and_meta_are_checked(dev):
    g = kernels.HashGrid(3, 4, 2, 14, 16, finest_resolution=64)
    m = nerf(dev)
    x = torch.rand(10, 3, device=dev)
    table = g.params.detach().to(dev)
    meta = (g.offsets, g.resolution, g.scales, g.hashed)
    with pytest.raises(ValueError, match="table has"):
        m.hash_grid_forward(x, table[:-8].contiguous(), *meta)
    with pytest.raises(ValueError, match="table must be Float"):
        m.hash_grid_forward(x, table.double(), *meta)
    with pytest.raises(ValueError, match="float32 or float64"):
        m.hash_grid_forward(x.half(), table.half(), *meta)
    small = g.resolution.clone()
    small[0] = 3  # a dense level whose cells would index past its rows
    with pytest.raises(ValueError, match="does not fit resolution"):
        m.hash_grid_forward(x, table, g.offsets, small, g.scales, g.hashed)
    go = torch.zeros(10, 7, device=dev)
    with pytest.raises(ValueError, match="grad_out must have shape"):
        m.hash_grid_backward(x, go, table.shape[0], 2, *meta)


@pytest.mark.parametrize("dev", DEVICES)
def test_occupancy_and_march_arguments_are_checked(dev):
    grid = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=16).to(dev)
    m = nerf(dev)
    p = torch.zeros(4, 3, device=dev)
    with pytest.raises(ValueError, match="bitfield must have shape"):
        m.occ_query(p, grid.bits[:, :-1].contiguous(), 16, grid.center, grid.half)
    with pytest.raises(ValueError, match="center and half"):
        m.occ_query(p, grid.bits, 16, grid.center[:2], grid.half)
    with pytest.raises(ValueError, match="points must be Float"):
        m.occ_query(p.double(), grid.bits, 16, grid.center, grid.half)
    o = torch.zeros(4, 3, device=dev)
    d = torch.tensor([[0.0, 0.0, 1.0]] * 4, device=dev)
    tn, tf, u = (
        torch.zeros(4, device=dev),
        torch.full((4,), 9.0, device=dev),
        torch.zeros(4, device=dev),
    )
    box = [-1.0, -1, -1, 1, 1, 1]
    with pytest.raises(ValueError, match="render step"):
        m.march_rays(o, d, tn, tf, u, box, 0.0, 0.0, 1.0, 8, None, 0, [0.0] * 3, [1.0] * 3)
    with pytest.raises(ValueError, match="far must have shape"):
        m.march_rays(
            o, d, tn, tf[:3].contiguous(), u, box, 0.01, 0.0, 1.0, 8, None, 0, [0.0] * 3, [1.0] * 3
        )


@pytest.mark.parametrize("dev", DEVICES)
def test_marching_terminates_where_steps_round_away(dev):
    # Outside the cascade, 1e5 from the origin, a 1e-3 step rounds away (t + dt == t): the ray
    # ends instead of repeating that pass forever.
    grid = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=16).to(dev)
    o = torch.tensor([[0.0, 0.0, -1e5]], device=dev)
    d = torch.tensor([[0.0, 0.0, 1.0]], device=dev)
    z, far = torch.zeros(1, device=dev), torch.full((1,), 3e5, device=dev)
    box = [-2e5, -2e5, -2e5, 2e5, 2e5, 2e5]
    args = (grid.bits, grid.resolution, grid.center, grid.half)
    ri, t0, t1, off, counts = nerf(dev).march_rays(o, d, z, far, z, box, 1e-3, 0.0, 1.0, 64, *args)
    assert int(counts[0]) <= 64 and off.tolist() == [0, int(counts[0])]


def splat_inputs(dev, n=6, h=20, w=36):
    g = torch.Generator().manual_seed(1)
    means = (torch.rand(n, 2, generator=g) * torch.tensor([w, h])).to(dev)
    conics = torch.tensor([[0.2, 0.0, 0.2]]).repeat(n, 1).to(dev)
    colors = torch.rand(n, 3, generator=g).to(dev)
    opac = torch.full((n,), 0.7).to(dev)
    off, ids = kernels.tile_bins(means, conics, opac, h, w)
    return means, conics, colors, opac, off, ids, h, w


@pytest.mark.parametrize("dev", DEVICES)
def test_splat_tiles_and_backward_buffers_are_checked(dev):
    m = splat_mod(dev)
    means, conics, colors, opac, off, ids, h, w = splat_inputs(dev)
    prm = (1 / 255, 0.99, 1e-4)
    bad_ids = ids.clone()
    bad_ids[0] = means.shape[0]
    with pytest.raises(ValueError, match="tile_ids values must lie"):
        m.tiled_forward(means, conics, colors, opac, h, w, off, bad_ids, *prm)
    bad_off = off.clone()
    bad_off[-1] += 1
    with pytest.raises(ValueError, match="tile_offsets must start at 0"):
        m.tiled_forward(means, conics, colors, opac, h, w, bad_off, ids, *prm)
    with pytest.raises(ValueError, match="colors must be Float"):
        m.tiled_forward(means, conics, colors.half(), opac, h, w, off, ids, *prm)
    rgb, trans, n = m.tiled_forward(means, conics, colors, opac, h, w, off, ids, *prm)
    g_rgb, g_t = torch.ones_like(rgb), torch.ones_like(trans)
    too_deep = n + int(ids.numel()) + 1
    with pytest.raises(ValueError, match="n_contrib values must lie"):
        m.tiled_backward(
            means, conics, colors, opac, h, w, off, ids, *prm, trans, too_deep, g_rgb, g_t
        )
    with pytest.raises(ValueError, match="n_contrib values must lie"):
        m.naive_backward(means, conics, colors, opac, h, w, *prm, trans, too_deep, g_rgb, g_t)
    with pytest.raises(ValueError, match="grad_rgb must have shape"):
        m.tiled_backward(
            means, conics, colors, opac, h, w, off, ids, *prm, trans, n, g_rgb[:-1], g_t
        )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda_second_device_matches_cpu_while_the_first_is_current():
    torch.cuda.set_device(0)
    means, conics, colors, opac, off, ids, h, w = splat_inputs("cpu")
    ref, _ = kernels.rasterize(means, conics, colors, opac, h, w)
    got, _ = kernels.rasterize(*(t.to("cuda:1") for t in (means, conics, colors, opac)), h, w)
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-5)
    sig, rgb, t0, t1, offs = packed("cpu")
    ri = torch.repeat_interleave(torch.arange(5), 4)
    a = kernels.composite(sig, rgb, t0, t1, ri, 5, offsets=offs)
    b = kernels.composite(*(t.to("cuda:1") for t in (sig, rgb, t0, t1, ri)), 5)
    for x, y in zip(a, b):
        torch.testing.assert_close(y.cpu(), x)
