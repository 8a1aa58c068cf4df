"""cull_round and move_rows: the compiled CPU ops against their pure-torch references."""

import pytest
import torch

from kernels import cull_round, move_rows


def round_case(n_rays=300, cap=16, seed=0):
    """A round of packed samples over a random subset of rays, with densities from clear to
    opaque, and the rays' depth and resume points from earlier rounds."""
    g = torch.Generator().manual_seed(seed)
    alive = torch.randperm(n_rays, generator=g)[: n_rays * 2 // 3].sort().values
    counts = torch.randint(0, cap + 1, (alive.numel(),), generator=g)
    counts[::3] = cap  # plenty of rays that filled the round
    offsets = torch.zeros(alive.numel() + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=offsets[1:])
    m = int(offsets[-1])
    t0 = torch.rand(m, generator=g) * 3
    t1 = t0 + 0.01 + 0.05 * torch.rand(m, generator=g)
    sigma = torch.exp(torch.randn(m, generator=g) * 3)  # 0.0001 .. 10000
    tau = torch.rand(n_rays, generator=g, dtype=torch.float64) * 6
    near = torch.rand(n_rays, generator=g)
    return offsets, alive, sigma, t0, t1, tau, near, cap


@pytest.mark.parametrize("alpha_min", [0.0, 0.01])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cull_round_matches_reference(cpu_ext, alpha_min, seed):
    offsets, alive, sigma, t0, t1, tau, near, cap = round_case(seed=seed)
    outs = []
    for backend in ("ext", "reference"):
        tau_b, near_b = tau.clone(), near.clone()
        keep, go = cull_round(
            offsets,
            alive,
            sigma,
            t0,
            t1,
            tau_b,
            near_b,
            cap=cap,
            tau_max=9.2,
            alpha_min=alpha_min,
            backend=backend,
        )
        outs.append((keep, go, tau_b, near_b))
    (k1, g1, tau1, n1), (k2, g2, tau2, n2) = outs
    assert torch.equal(k1, k2) and torch.equal(g1, g2) and torch.equal(n1, n2)
    # Summed per ray in order here, by a round-wide cumulative sum there: float64 rounding only.
    torch.testing.assert_close(tau1, tau2, rtol=1e-12, atol=0)
    # Not vacuous: some samples are culled, some kept; some rays go on, some stop.
    assert 0 < int(k1.sum()) < k1.numel() and 0 < int(g1.sum()) < g1.numel()
    untouched = torch.ones_like(tau, dtype=torch.bool)
    untouched[alive] = False
    assert torch.equal(tau1[untouched], tau[untouched]) and torch.equal(
        n1[untouched], near[untouched]
    )


def test_cull_round_empty_round(cpu_ext):
    offsets, alive = torch.zeros(4, dtype=torch.int64), torch.tensor([0, 2, 5])
    z = torch.zeros(0)
    tau, near = torch.ones(6, dtype=torch.float64), torch.full((6,), 0.5)
    keep, go = cull_round(offsets, alive, z, z, z, tau, near, cap=4, tau_max=9.2)
    assert keep.numel() == 0 and not go.any()
    assert torch.equal(near, torch.full((6,), 0.5)) and torch.equal(
        tau, torch.ones(6, dtype=torch.float64)
    )


def test_cull_round_refuses_bad_arguments(cpu_ext):
    offsets, alive, sigma, t0, t1, tau, near, cap = round_case()
    bad = offsets.clone()
    bad[-1] += 1
    with pytest.raises(ValueError, match="offsets must start at 0"):
        cull_round(bad, alive, sigma, t0, t1, tau, near, cap=cap, tau_max=9.2)
    with pytest.raises(ValueError, match="alive values must lie in"):
        cull_round(offsets, alive + 1000, sigma, t0, t1, tau, near, cap=cap, tau_max=9.2)
    with pytest.raises(ValueError, match="tau must be Double"):
        cull_round(offsets, alive, sigma, t0, t1, tau.float(), near, cap=cap, tau_max=9.2)
    with pytest.raises(ValueError, match="t_ends must have shape"):
        cull_round(offsets, alive, sigma, t0, t1[:-1], tau, near, cap=cap, tau_max=9.2)


@pytest.mark.parametrize("shape", [(500,), (500, 32), (500, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_move_rows_matches_reference(cpu_ext, shape, dtype):
    g = torch.Generator().manual_seed(0)
    src = (torch.randn(*shape, generator=g) * 100).to(dtype)
    idx = torch.randint(0, 500, (7000,), generator=g)[:300]
    dest = torch.randperm(800, generator=g)[:300]
    out = []
    for backend in ("ext", "reference"):
        dst = torch.zeros((800, *shape[1:]), dtype=dtype)
        assert move_rows(dst, dest, src, idx, backend=backend) is dst
        out.append(dst)
    assert torch.equal(out[0], out[1]) and out[0].abs().sum() > 0


def test_move_rows_refuses_bad_indices(cpu_ext):
    src, dst = torch.randn(10, 4), torch.zeros(5, 4)
    with pytest.raises(ValueError, match="dest values must lie in"):
        move_rows(dst, torch.tensor([5]), src, torch.tensor([0]))
    with pytest.raises(ValueError, match="idx values must lie in"):
        move_rows(dst, torch.tensor([0]), src, torch.tensor([-1]))
    with pytest.raises(ValueError, match="row shape"):
        move_rows(torch.zeros(5, 3), torch.tensor([0]), src, torch.tensor([0]))
    with pytest.raises(ValueError, match="share a dtype"):
        move_rows(dst.double(), torch.tensor([0]), src, torch.tensor([0]))
