"""The benchmark's tuned pure-torch baselines compute what the references compute."""

import math

import torch

import kernels
from experiments import kernels_baselines as tuned


def test_hash_grid_tuned_matches_reference():
    torch.manual_seed(0)
    for d in (2, 3):
        g = kernels.HashGrid(d, 6, 2, 14, 16, finest_resolution=512, dtype=torch.float64)
        with torch.no_grad():
            g.params.uniform_(-1, 1)
        x = torch.rand(3000, d, dtype=torch.float64)
        x[:2] = torch.tensor([0.0, 1.0], dtype=torch.float64)[:, None]
        a, b = tuned.hash_grid_tuned(x, g), g(x, backend="reference")
        torch.testing.assert_close(a, b)
        w = torch.randn_like(a)
        (ga,) = torch.autograd.grad(a, g.params, w)
        (gb,) = torch.autograd.grad(b, g.params, w)
        torch.testing.assert_close(ga, gb)


def test_composite_tuned_matches_reference():
    torch.manual_seed(0)
    n = 200
    counts = torch.randint(0, 40, (n,))
    ri = torch.repeat_interleave(torch.arange(n), counts)
    t0 = torch.sort(torch.rand(ri.numel())).values
    t1 = t0 + 0.02
    sig = (torch.rand(ri.numel()) * 30).requires_grad_(True)
    rgb = torch.rand(ri.numel(), 3).requires_grad_(True)
    off = kernels.ray_offsets(ri, n)
    a = tuned.composite_tuned(sig, rgb, t0, t1, ri, n, off, background=0.5)
    b = kernels.composite(sig, rgb, t0, t1, ri, n, 0.5, offsets=off, backend="reference")
    ws = [torch.randn_like(o) for o in a]
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    for x, y in zip(torch.autograd.grad(a, [sig, rgb], ws), torch.autograd.grad(b, [sig, rgb], ws)):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def test_march_tuned_matches_reference():
    grid = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=32)
    grid.update(lambda x: 50.0 * ((x.norm(dim=-1) - 0.6).abs() < 0.15).float(), warmup=True)
    g = torch.Generator().manual_seed(0)
    o = torch.randn(300, 3, generator=g)
    o = 2.5 * o / o.norm(dim=-1, keepdim=True)
    d = torch.nn.functional.normalize(-o + 0.5 * torch.randn(300, 3, generator=g), dim=-1)
    step = 2 * math.sqrt(3) / 256
    a = tuned.march_tuned(o, d, grid, step, max_samples=50, chunk=128)
    b = kernels.march_rays(o, d, grid, render_step_size=step, max_samples=50, backend="reference")
    assert b.n_samples > 1000
    # t = tmin + k * step here, a running sum there: a rounding apart, so a midpoint on a cell face
    # may land on either side. Nearly every ray must agree exactly, the rest by a sample.
    same = a.counts == b.counts
    assert same.float().mean() > 0.97 and (a.counts - b.counts).abs().max() <= 1
    keep_a = same[a.ray_indices]
    keep_b = same[b.ray_indices]
    torch.testing.assert_close(a.t_starts[keep_a], b.t_starts[keep_b], rtol=0, atol=1e-5)


def test_nerf_mlp_tuned_matches_reference():
    torch.manual_seed(0)

    def seq(*dims):
        layers = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers += [torch.nn.Linear(a, b)] + (
                [torch.nn.ReLU(inplace=True)] * (i < len(dims) - 2)
            )
        return torch.nn.Sequential(*layers).double()

    dens, col = seq(32, 64, 16), seq(31, 64, 64, 3)
    enc = torch.randn(500, 32, dtype=torch.float64, requires_grad=True)
    sh = torch.randn(500, 16, dtype=torch.float64)

    def pairs(net):
        return [(m.weight, m.bias) for m in net if isinstance(m, torch.nn.Linear)]

    a = tuned.nerf_mlp_tuned(enc, dens, sh, col)
    b = kernels.nerf_mlp_reference(enc, pairs(dens), sh, pairs(col))
    params = [enc, *dens.parameters(), *col.parameters()]
    ws = [torch.randn_like(o) for o in a]
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)
    for x, y in zip(torch.autograd.grad(a, params, ws), torch.autograd.grad(b, params, ws)):
        torch.testing.assert_close(x, y)
