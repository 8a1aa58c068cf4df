"""The distortion loss over packed samples against its O(S^2) definition, its gradient, and the
weights it is taken over against the compositing kernel's."""

import torch

from kernels import composite
from worker.nerf.losses import distortion, distortion_reference, render_weights


def _packed(counts, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    offsets = torch.zeros(len(counts) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.tensor(counts), 0)
    t0, t1 = [], []
    for c in counts:
        # Sorted, gapped intervals of unequal lengths, as cone-angle marching gives.
        edges = torch.sort(torch.rand(2 * c, generator=g, dtype=dtype) * 5.0).values
        t0.append(edges[0::2])
        t1.append(edges[1::2])
    t0 = torch.cat(t0) if t0 else torch.zeros(0, dtype=dtype)
    t1 = torch.cat(t1) if t1 else torch.zeros(0, dtype=dtype)
    w = torch.rand(int(offsets[-1]), generator=g, dtype=dtype) * 0.3
    return w, t0, t1, offsets


def test_distortion_matches_its_definition():
    # Rays with 0, 1 and many samples, so the per-ray prefix sums must restart at each ray.
    w, t0, t1, offsets = _packed([5, 0, 1, 17, 3, 40])
    got = distortion(w, t0, t1, offsets)
    want = distortion_reference(w, t0, t1, offsets)
    assert got.shape == (6,)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert got[1] == 0 and got[3] > 0


def test_distortion_prefers_concentrated_weights():
    # Same total weight on one ray, spread over the ray or gathered into one stretch.
    t0 = torch.linspace(0, 4, 41, dtype=torch.float64)[:-1]
    t1 = t0 + 0.1
    offsets = torch.tensor([0, 40, 80])
    spread = torch.full((40,), 0.02, dtype=torch.float64)
    gathered = torch.zeros(40, dtype=torch.float64)
    gathered[20:24] = 0.2
    loss = distortion(
        torch.cat([spread, gathered]), torch.cat([t0, t0]), torch.cat([t1, t1]), offsets
    )
    assert loss[1] < 0.2 * loss[0]


def test_distortion_gradient():
    w, t0, t1, offsets = _packed([4, 0, 6, 2], seed=1)
    w.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: distortion(x, t0, t1, offsets), (w,))
    # and the same gradient as the definition's
    g = torch.autograd.grad(distortion(w, t0, t1, offsets).sum(), w)[0]
    g_ref = torch.autograd.grad(distortion_reference(w, t0, t1, offsets).sum(), w)[0]
    torch.testing.assert_close(g, g_ref)


def test_render_weights_match_the_compositor():
    g = torch.Generator().manual_seed(2)
    _, t0, t1, offsets = _packed([7, 3, 0, 12], seed=2, dtype=torch.float32)
    sigma = torch.rand(t0.numel(), generator=g) * 2.0
    w = render_weights(sigma, t0, t1, offsets)
    ray = torch.repeat_interleave(torch.arange(4), offsets[1:] - offsets[:-1])
    _, _, opacity = composite(sigma, torch.zeros(t0.numel(), 3), t0, t1, ray, 4, offsets=offsets)
    per_ray = torch.zeros(4).index_add(0, ray, w)
    torch.testing.assert_close(per_ray, opacity, rtol=1e-5, atol=1e-6)
    # differentiable w.r.t. sigma, through the distortion loss
    s = sigma.double().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: distortion(
            render_weights(x, t0.double(), t1.double(), offsets), t0.double(), t1.double(), offsets
        ),
        (s,),
    )
