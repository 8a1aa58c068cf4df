import math

import numpy as np
import pytest
import torch

import kernels


def assert_close(a, b, rtol=1e-4, atol=1e-6):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def make_grid(
    d=3, dtype=torch.float32, log2=14, finest=512, features=2, levels=16, init=1.0, seed=0
):
    torch.manual_seed(seed)
    g = kernels.HashGrid(d, levels, features, log2, 16, finest_resolution=finest, dtype=dtype)
    with torch.no_grad():
        g.params.uniform_(-init, init)
    return g


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_and_grad_match_reference(cpu_ext, d, dtype):
    g = make_grid(d, dtype)
    assert g.hashed.any() and not g.hashed.all(), "test should cover dense and hashed levels"
    x = torch.rand(3000, d, dtype=dtype)
    out = g(x)
    ref = g(x, backend="reference")
    assert out.shape == (3000, g.n_output_dims)
    assert_close(out, ref)
    w = torch.randn_like(out)
    (ga,) = torch.autograd.grad((out * w).sum(), g.params)
    (gb,) = torch.autograd.grad((ref * w).sum(), g.params)
    assert_close(ga, gb, atol=1e-5)


def test_gradcheck_small(cpu_ext):
    # Checking the whole table would take one forward per parameter; instead a few of the rows the
    # points touch become the gradcheck input, written into an otherwise fixed table.
    g = make_grid(3, torch.float64, levels=4, finest=256, features=2)
    x = torch.rand(20, 3, dtype=torch.float64)
    meta = (g.scales, g.resolution, g.offsets, g.hashed)
    fn = kernels.hash_grid._HashGridFn.apply
    base = g.params.detach().clone()
    touched = (
        torch.autograd.grad(g(x, backend="reference").sum(), g.params)[0]
        .abs()
        .sum(1)
        .nonzero()
        .squeeze(1)
    )
    rows = touched[torch.randperm(touched.numel())[:24]]
    assert g.hashed[(rows[:, None] >= g.offsets[1:]).sum(1)].any(), "include hashed-level rows"

    def f(p):
        return fn(x, base.index_put((rows,), p), *meta)

    p = base[rows].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (p,), eps=1e-6, atol=1e-6)


def test_cell_boundaries_zero_and_one(cpu_ext):
    g = make_grid(3, levels=8, finest=256)
    # Points exactly on level-l cell faces: scale*x + 0.5 is an integer.
    pts = [torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.5]])]
    for level in range(g.n_levels):
        s = float(g.scales[level])
        k = torch.arange(1, int(s)).float()
        on_face = ((k - 0.5) / s).clamp(0, 1)
        pts.append(torch.stack([on_face, on_face.flip(0), torch.full_like(on_face, 0.5)], 1))
    x = torch.cat(pts)
    assert_close(g(x), g(x, backend="reference"))
    # floor (not round) makes the corner weights a partition of unity with no negative weight:
    # a table of ones encodes every point as exactly one, a positive table never goes negative.
    with torch.no_grad():
        g.params.fill_(1.0)
        assert_close(g(x), torch.ones(x.shape[0], g.n_output_dims))
        g.params.uniform_(0.0, 1.0)
        assert (g(x) >= 0).all()


def test_outside_unit_cube_is_clamped(cpu_ext):
    g = make_grid(3, levels=4, finest=64)
    x = torch.tensor([[-0.5, 1.5, 2.0], [float("nan"), 0.5, 0.5]])
    clamped = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.5, 0.5]])
    assert_close(g(x), g(clamped))
    assert_close(g(x, backend="reference"), g(clamped))


def test_encoding_is_continuous_across_faces(cpu_ext):
    g = make_grid(3, levels=6, finest=128)
    s = float(g.scales[3])
    face = (5 - 0.5) / s
    eps = 1e-5
    a = g(torch.tensor([[face - eps, 0.3, 0.7]]))
    b = g(torch.tensor([[face + eps, 0.3, 0.7]]))
    assert (a - b).abs().max() < 1e-2


@pytest.mark.parametrize("d", [2, 3])
def test_backward_scatter_same_with_one_and_two_threads(cpu_ext, d):
    g = make_grid(d, log2=14, finest=2048)
    x = torch.rand(20000, d)  # many collisions in the hashed levels
    w = torch.randn(20000, g.n_output_dims)
    grads = []
    for n in (1, 2):
        torch.set_num_threads(n)
        (gr,) = torch.autograd.grad((g(x) * w).sum(), g.params)
        grads.append(gr)
    assert torch.equal(grads[0], grads[1])


def test_layout_and_defaults():
    g = kernels.HashGrid(3, 16, 2, 19, 16, finest_resolution=2048)
    assert g.n_output_dims == 32
    assert math.isclose(16 * g.per_level_scale**15, 2048, rel_tol=1e-9)
    rows = g.offsets[1:] - g.offsets[:-1]
    assert (rows <= 2**19).all()
    assert (rows[g.hashed] == 2**19).all()
    assert (g.resolution[~g.hashed] ** 3 <= rows[~g.hashed]).all()
    assert g.params.abs().max() <= 1e-4 and g.params.abs().max() > 0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(n_input_dims=4),
        dict(log2_hashmap_size=13),
        dict(log2_hashmap_size=25),
        dict(n_features_per_level=3),
        dict(backend="cuda-magic"),
    ],
)
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        kernels.HashGrid(**{"log2_hashmap_size": 14, **kwargs})


def test_wrong_input_shape():
    g = kernels.HashGrid(3, log2_hashmap_size=14)
    with pytest.raises(ValueError):
        g(torch.rand(10, 2))


def test_forward_tail_and_nan_inputs_match_reference(cpu_ext):
    # 1003 points: blocks of 64 and prefetch groups of 16 both end in a partial one.
    g = make_grid(3, torch.float32)
    x = torch.rand(1003, 3)
    x[5, 1] = float("nan")
    x[1002] = torch.tensor([1.0, 0.0, 1.5])
    assert_close(g(x), g(x, backend="reference"))


def test_attach_reuses_features_with_the_same_gradient(cpu_ext):
    g = make_grid(3, torch.float32)
    x = torch.rand(500, 3)
    w = torch.randn(500, g.n_output_dims)
    (direct,) = torch.autograd.grad((g(x) * w).sum(), g.params)
    with torch.no_grad():
        enc = g(x)
    attached = g.attach(x, enc)
    assert torch.equal(attached, enc)
    (reused,) = torch.autograd.grad((attached * w).sum(), g.params)
    assert torch.equal(direct, reused)


def test_row_sparse_adam_matches_the_dense_update(cpu_ext):
    # The CPU path (persistent row gradient + compiled row-sparse step) against the dense
    # `.grad` path (reference backend): same rows updated, same values; untouched rows stay.
    a, b = make_grid(3, torch.float32, init=1e-2), make_grid(3, torch.float32, init=1e-2)
    b.backend = "reference"
    opt_a = kernels.HashGridAdam(a, lr=1e-2, betas=(0.9, 0.99), eps=1e-15)
    opt_b = kernels.HashGridAdam(b, lr=1e-2, betas=(0.9, 0.99), eps=1e-15)
    assert a.row_grad is not None and b.row_grad is None
    before = a.params.detach().clone()
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        x = torch.rand(300, 3, generator=gen) * (0.5 if step % 2 else 1.0)
        w = torch.randn(300, a.n_output_dims, generator=gen)
        for g, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            (g(x) * w).sum().backward()
            opt.step()
    assert a.params.grad is None  # no dense gradient on the CPU path
    assert torch.equal(opt_a.steps, opt_b.steps)
    assert int(opt_a.steps.max()) == 4 and (opt_a.steps == 0).any()
    assert_close(a.params.detach(), b.params.detach(), rtol=1e-4, atol=1e-6)
    assert_close(opt_a.exp_avg_sq, opt_b.exp_avg_sq, rtol=1e-4, atol=1e-12)
    untouched = opt_a.steps == 0
    assert torch.equal(a.params.detach()[untouched], before[untouched])
    assert not a.row_grad.touched.any() and not a.row_grad.values.any()  # cleared for next step


@pytest.mark.parametrize("n_features", [1, 2, 4, 8])
def test_compiled_table_adam_has_the_bits_of_its_formula(cpu_ext, n_features):
    # The compiled step (vector groups of rows, then a scalar tail: 203 rows is no multiple of
    # 8 / F) against adam_row's formula in numpy float32, one rounding per operation (torch may
    # divide by multiplying with a reciprocal), so bit for bit.
    gen = torch.Generator().manual_seed(n_features)
    rows, f = 203, n_features
    w, g, m = (torch.randn(rows, f, generator=gen) for _ in range(3))
    v = torch.rand(rows, f, generator=gen)
    steps = torch.randint(0, 6, (rows,), generator=gen, dtype=torch.int32)
    touched = (torch.rand(rows, generator=gen) < 0.5).to(torch.uint8)
    touched[:8] = 0  # a whole vector group with no touched row
    t = torch.arange(64, dtype=torch.float64)
    bc1, bc2 = (1 - 0.9**t).float(), torch.sqrt(1 - 0.99**t).float()
    lr, b1, b2, eps = (np.float32(c) for c in (1e-2, 0.9, 0.99, 1e-15))
    on = touched.numpy().astype(bool)[:, None]
    n = steps.numpy() + 1
    c1, c2 = bc1.numpy()[n][:, None], bc2.numpy()[n][:, None]
    w0, g0, m0, v0 = (a.numpy().copy() for a in (w, g, m, v))
    m1 = b1 * m0 + (np.float32(1) - b1) * g0
    v1 = b2 * v0 + (np.float32(1) - b2) * g0 * g0
    w1 = w0 - (lr / c1) * m1 / (np.sqrt(v1) / c2 + eps)
    want = {
        "w": np.where(on, w1, w0),
        "m": np.where(on, m1, m0),
        "v": np.where(on, v1, v0),
        "g": np.where(on, np.float32(0), g0),
        "steps": np.where(on[:, 0], n, n - 1),
    }
    cpu_ext.hash_grid_adam(w, g, touched, m, v, steps, bc1, bc2, 1e-2, 0.9, 0.99, 1e-15)
    got = {"w": w, "m": m, "v": v, "g": g, "steps": steps}
    for k in want:
        assert want[k].dtype == got[k].numpy().dtype, k
        assert np.array_equal(got[k].numpy(), want[k]), k
    assert not touched.any()


def test_row_sparse_adam_refuses_step_counts_past_its_bias_tables(cpu_ext):
    # The bound is checked per touched row inside the kernel (no scan of every row's count): a
    # count the tables cannot index is a clear error, and those rows keep their values.
    g = make_grid(3, torch.float32, init=1e-2)
    opt = kernels.HashGridAdam(g, lr=1e-2)
    x = torch.rand(64, 3, generator=torch.Generator().manual_seed(2))
    g(x).sum().backward()
    opt.step()
    touched = opt.steps > 0
    opt.steps[touched] = 1 << 20  # as if restored from a foreign state
    before = g.params.detach().clone()
    g(x).sum().backward()
    with pytest.raises(ValueError, match="bias tables"):
        opt.step()
    assert torch.equal(g.params.detach()[touched], before[touched])


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("features", [1, 2, 4, 8])
def test_vector_and_scalar_loops_give_the_same_bits(cpu_ext, monkeypatch, d, features):
    # The AVX2 loops (float32, where the CPU has them) compute the scalar body's operations in its
    # order: forward, row gradient and touched flags are the same bits. 1003 points: partial
    # lane groups; zero output gradients: skipped points.
    g = make_grid(d, log2=14, finest=1024, features=features, levels=12, seed=features)
    gen = torch.Generator().manual_seed(features)
    x = torch.rand(1003, d, generator=gen) * 1.2 - 0.1
    x[0, 0], x[1] = float("nan"), 1.0
    go = torch.randn(1003, g.n_output_dims, generator=gen)
    go[::5] = 0
    go[1::7, : features * 3] = 0
    meta = (g.offsets, g.resolution, g.scales, g.hashed)
    runs = []
    for scalar in (False, True):
        if scalar:
            monkeypatch.setenv("KERNELS_HASH_GRID_SCALAR", "1")
        else:
            monkeypatch.delenv("KERNELS_HASH_GRID_SCALAR", raising=False)
        values = torch.full_like(g.params, 0.25)
        touched = torch.zeros(g.params.shape[0], dtype=torch.uint8)
        with torch.no_grad():
            enc = cpu_ext.hash_grid_forward(x, g.params, *meta)
        cpu_ext.hash_grid_backward_rows(x, go, values, touched, *meta)
        runs.append((enc, values, touched))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
