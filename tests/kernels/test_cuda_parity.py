"""The same parity checks on CUDA tensors (run by scripts/gpu_check.sh on a GPU machine).

Tolerances, since a correct kernel may round differently in the last bit (another summation order,
atomics, the device's own exp/log): floats within rtol 1e-4, atol 1e-5 of the pure-torch reference
and of the CPU build (`close`); marched samples equal ray by ray except where a position lands the
other way of a cell or box boundary: at most 0.1 % of rays may differ in their sample count, by at
most 2, and the other rays' sample starts agree within 1e-6 (`same_samples`). Occupancy bits and
lookups are compared exactly: both sides threshold the same float densities, none of them near the
threshold, and look up the same bits.
"""

import pytest
import torch

import kernels

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device (CPU-only torch or no GPU)"
)
DEV = "cuda"


def close(a, b, rtol=1e-4, atol=1e-5):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hash_grid(d, dtype):
    torch.manual_seed(0)
    g = kernels.HashGrid(d, 16, 2, 14, 16, finest_resolution=1024, dtype=dtype).to(DEV)
    with torch.no_grad():
        g.params.uniform_(-1, 1)
    x = torch.rand(5000, d, device=DEV, dtype=dtype)
    x[:3] = 1.0
    out, ref = g(x), g(x, backend="reference")
    close(out, ref)
    w = torch.randn_like(out)
    (ga,) = torch.autograd.grad(out, g.params, w)
    (gb,) = torch.autograd.grad(ref, g.params, w)
    close(ga, gb)
    cpu = g.cpu()
    close(cpu(x.cpu()), out.cpu())


def test_sh():
    d = torch.nn.functional.normalize(torch.randn(1000, 3, device=DEV), dim=-1)
    close(kernels.sh_encode(d), kernels.sh_encode(d, backend="reference"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_composite(dtype):
    torch.manual_seed(0)
    n = 300
    counts = torch.randint(0, 50, (n,), device=DEV)
    ri = torch.repeat_interleave(torch.arange(n, device=DEV), counts)
    t0 = torch.rand(ri.numel(), device=DEV, dtype=dtype)
    t1 = t0 + 0.02
    sig = (torch.rand(ri.numel(), device=DEV, dtype=dtype) * 20).requires_grad_(True)
    rgb = torch.rand(ri.numel(), 3, device=DEV, dtype=dtype).requires_grad_(True)
    outs = kernels.composite(sig, rgb, t0, t1, ri, n, background=1.0)
    refs = kernels.composite(sig, rgb, t0, t1, ri, n, background=1.0, backend="reference")
    for a, b in zip(outs, refs):
        close(a, b)
    ws = [torch.randn_like(o) for o in outs]
    for a, b in zip(
        torch.autograd.grad(outs, [sig, rgb], ws), torch.autograd.grad(refs, [sig, rgb], ws)
    ):
        close(a, b)


def same_samples(a, b, max_ray_share=1e-3, max_count_diff=2):
    ca, cb = a.counts.cpu(), b.counts.cpu()
    differ = ca != cb
    assert differ.float().mean().item() <= max_ray_share, (
        f"{int(differ.sum())} of {ca.numel()} rays march a different number of samples"
    )
    assert (ca - cb).abs().max().item() <= max_count_diff
    ia, ib = a.ray_indices.cpu(), b.ray_indices.cpu()
    ka, kb = ~differ[ia], ~differ[ib]  # the samples of rays whose counts agree
    assert torch.equal(ia[ka], ib[kb])
    close(a.t_starts.cpu()[ka], b.t_starts.cpu()[kb], rtol=1e-6, atol=1e-6)


def _grid():
    g = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=64, n_cascades=2).to(DEV)
    g.update(lambda x: 50.0 * ((x.norm(dim=-1) - 0.6).abs() < 0.15).float(), warmup=True)
    return g


def test_occupancy():
    g = _grid()
    bits = g.bits.clone()
    g.binarize(backend="reference")
    assert torch.equal(bits, g.bits)
    p = torch.rand(20000, 3, device=DEV) * 4 - 2
    assert torch.equal(g.is_occupied(p), g.is_occupied(p, backend="reference"))


@pytest.mark.parametrize("cone", [0.0, 0.02])
def test_march(cone):
    g = _grid()
    gen = torch.Generator().manual_seed(0)
    o = torch.randn(2000, 3, generator=gen)
    o = (3 * o / o.norm(dim=-1, keepdim=True)).to(DEV)
    d = torch.nn.functional.normalize(
        -o + 0.7 * torch.randn(2000, 3, generator=gen).to(DEV), dim=-1
    )
    kw = dict(render_step_size=0.01, cone_angle=cone, max_samples=400)
    a = kernels.march_rays(o, d, g, **kw)
    b = kernels.march_rays(o, d, g, backend="reference", **kw)
    c = kernels.march_rays(o.cpu(), d.cpu(), g.cpu(), **kw)
    assert a.n_samples > 1000
    for other in (b, c):
        same_samples(a, other)
