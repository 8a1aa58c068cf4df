import pytest
import torch

import kernels


def assert_close(a, b, rtol=1e-4, atol=1e-6):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def packed(n_rays=64, max_per_ray=40, dtype=torch.float32, sigma_scale=3.0, seed=0):
    torch.manual_seed(seed)
    counts = torch.randint(0, max_per_ray, (n_rays,))
    counts[0] = 0  # a ray without samples
    ri = torch.repeat_interleave(torch.arange(n_rays), counts)
    dt = torch.rand(ri.numel(), dtype=dtype) * 0.05 + 1e-3
    t = torch.cumsum(dt, 0)
    # restart t per ray at 0.1
    off = kernels.ray_offsets(ri, n_rays)
    t = t - torch.cat([t.new_zeros(1), t])[off[:-1]][ri] + 0.1
    t0, t1 = t - dt, t
    sig = (torch.rand(ri.numel(), dtype=dtype) * sigma_scale).requires_grad_(True)
    rgb = torch.rand(ri.numel(), 3, dtype=dtype).requires_grad_(True)
    return sig, rgb, t0, t1, ri, n_rays


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sigma_scale", [0.5, 50.0])  # 50: most rays stop early
def test_forward_and_grads_match_reference(cpu_ext, dtype, sigma_scale):
    sig, rgb, t0, t1, ri, n = packed(dtype=dtype, sigma_scale=sigma_scale)
    bg = torch.tensor([0.2, 0.5, 1.0], dtype=dtype)
    outs = kernels.composite(sig, rgb, t0, t1, ri, n, background=bg)
    refs = kernels.composite(sig, rgb, t0, t1, ri, n, background=bg, backend="reference")
    for a, b in zip(outs, refs):
        assert_close(a, b)
    ws = [torch.randn_like(o) for o in outs]
    ga = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, ws)), [sig, rgb])
    gb = torch.autograd.grad(sum((o * w).sum() for o, w in zip(refs, ws)), [sig, rgb])
    for a, b in zip(ga, gb):
        assert_close(a, b, atol=1e-5)


def test_gradcheck(cpu_ext):
    sig, rgb, t0, t1, ri, n = packed(n_rays=5, max_per_ray=6, dtype=torch.float64)
    off = kernels.ray_offsets(ri, n)

    def f(s, c):
        return kernels.composite(s, c, t0, t1, ri, n, background=0.3, offsets=off)

    assert torch.autograd.gradcheck(f, (sig, rgb))


def test_no_samples_gives_background(cpu_ext):
    empty = torch.zeros(0)
    rgb, depth, opacity = kernels.composite(
        empty.requires_grad_(),
        torch.zeros(0, 3),
        empty,
        empty,
        torch.zeros(0, dtype=torch.long),
        4,
        background=0.25,
    )
    assert_close(rgb, torch.full((4, 3), 0.25))
    assert_close(depth, torch.zeros(4))
    assert_close(opacity, torch.zeros(4))


def test_early_stop_zeroes_later_samples(cpu_ext):
    # The first sample is opaque enough that T < 1e-4 after it; the rest must not contribute.
    sig = torch.tensor([20.0, 1.0, 1.0], requires_grad=True)
    rgb = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], requires_grad=True)
    t0 = torch.tensor([0.0, 1.0, 2.0])
    t1 = t0 + 1.0
    ri = torch.zeros(3, dtype=torch.long)
    for backend in ("ext", "reference"):
        out, depth, opacity = kernels.composite(sig, rgb, t0, t1, ri, 1, backend=backend)
        assert out[0, 1] == 0 and out[0, 2] == 0
        gs, gc = torch.autograd.grad(out.sum() + depth.sum(), [sig, rgb])
        assert gs[1] == 0 and gs[2] == 0 and (gc[1:] == 0).all()
        assert gc[0, 0] > 0.99


def test_unsorted_ray_indices_rejected():
    s = torch.rand(3)
    with pytest.raises(ValueError):
        kernels.composite(s, torch.rand(3, 3), s, s + 1, torch.tensor([1, 0, 1]), 2)
    with pytest.raises(ValueError):
        kernels.composite(s, torch.rand(3, 3), s, s + 1, torch.tensor([0, 1, 2]), 2)
