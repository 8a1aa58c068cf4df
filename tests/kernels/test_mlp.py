import pytest
import torch

import kernels
from kernels.mlp import _nerf_mlp_ext


def _isas():
    # An AVX-512 CPU also has AVX2 + FMA, and every CPU runs the portable body.
    best = int(kernels._ext.load_cpu().mlp_isa())
    return [isa for isa in (512, 256, 0) if isa <= best]


ISAS = _isas()


def net(dims, gen):
    return [
        (torch.randn(o, i, generator=gen) / i**0.5, 0.3 * torch.randn(o, generator=gen))
        for i, o in zip(dims[:-1], dims[1:])
    ]


def field(n, *, n_in=32, dens=(64,), geo=15, sh_dim=16, col=(64, 64), seed=0):
    """enc, sh, density layers, colour layers (NerfField's shapes by default)."""
    g = torch.Generator().manual_seed(seed)
    enc = torch.randn(n, n_in, generator=g)
    sh = torch.randn(n, sh_dim, generator=g) if sh_dim else None
    d = net([n_in, *dens, 1 + geo], g)
    c = net([sh_dim + geo, *col, 3], g) if sh_dim else None
    return enc, sh, d, c


def run(fn, enc, sh, d, c, dtype=torch.float32, sh_grad=False, seed=1):
    """Outputs, then gradients of enc, (sh,) and every weight and bias for fixed random upstream
    gradients."""

    def leaf(t, grad=True):
        return t.detach().clone().to(dtype).requires_grad_(grad)

    e = leaf(enc)
    s = None if sh is None else leaf(sh, sh_grad)
    dd = [(leaf(w), leaf(b)) for w, b in d]
    cc = None if c is None else [(leaf(w), leaf(b)) for w, b in c]
    sigma, rgb = fn(e, dd, s, cc, 1.0)
    n = enc.shape[0]
    g = torch.Generator().manual_seed(seed)
    outs, ups = [sigma], [torch.randn(n, generator=g).to(dtype)]
    if rgb is not None:
        outs.append(rgb)
        ups.append(torch.randn(n, 3, generator=g).to(dtype))
    leaves = [e] + ([s] if sh_grad else []) + [t for wb in dd + (cc or []) for t in wb]
    grads = torch.autograd.grad(outs, leaves, ups) if n else [torch.zeros_like(t) for t in leaves]
    return [o.detach() for o in outs] + list(grads)


def reference(e, d, s, c, shift):
    return kernels.nerf_mlp_reference(e, d, s, c, density_shift=shift)


def ext(block=0, isa=-1):
    return lambda e, d, s, c, shift: _nerf_mlp_ext(e, d, s, c, shift, block, isa)


def assert_matches_reference(got, ref):
    assert len(got) == len(ref)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert a.dtype == torch.float32 and a.shape == b.shape, i
        scale = float(b.abs().max()) if b.numel() else 1.0
        torch.testing.assert_close(
            a.double(), b, rtol=1e-4, atol=1e-5 * max(scale, 1.0), msg=f"output/grad {i}"
        )


def assert_same_bits(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), f"output/grad {i} differs"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n,block", [(1, 0), (37, 16), (1000, 0), (3001, 0), (300, 7)])
def test_field_matches_float64_reference(cpu_ext, isa, n, block):
    # 3001 rows: three gradient groups, the last one short; 37 and 300 end in a partial block.
    case = field(n)
    got = run(ext(block, isa), *case)
    assert_matches_reference(got, run(reference, *case, dtype=torch.float64))


@pytest.mark.parametrize("isa", ISAS)
def test_density_only_matches_reference(cpu_ext, isa):
    enc, _, d, _ = field(777)
    got = run(ext(0, isa), enc, None, d, None)
    assert len(got) == 1 + 1 + 4  # sigma, then enc and the density weights and biases
    assert_matches_reference(got, run(reference, enc, None, d, None, dtype=torch.float64))


@pytest.mark.parametrize(
    "shape",
    [
        dict(n_in=32, dens=(), geo=15, sh_dim=16, col=()),  # no hidden layer in either network
        dict(n_in=24, dens=(48, 40), geo=8, sh_dim=9, col=(24,)),
        dict(n_in=16, dens=(128,), geo=0, sh_dim=4, col=(72, 16, 40)),  # no geometry features
        dict(n_in=64, dens=(512,), geo=127, sh_dim=1, col=(8,)),
    ],
)
def test_other_widths_and_depths(cpu_ext, shape):
    case = field(301, **shape)
    assert_matches_reference(run(ext(), *case), run(reference, *case, dtype=torch.float64))


def test_sh_gradient_when_asked(cpu_ext):
    case = field(500)
    got = run(ext(), *case, sh_grad=True)
    assert_matches_reference(got, run(reference, *case, dtype=torch.float64, sh_grad=True))


@pytest.mark.parametrize("bias", [40.0, -40.0])
def test_gradient_of_density_is_clamped_like_trunc_exp(cpu_ext, bias):
    # h0 - 1 beyond +-15 on every row: sigma is exp(h0 - 1), its gradient uses exp(+-15).
    enc, sh, d, c = field(200)
    d[-1][1][0] = bias
    sigma = kernels.nerf_mlp(enc, d, sh, c)[0]
    assert (sigma > 3.3e6).all() if bias > 0 else (sigma < 3e-7).all()
    got = run(ext(), enc, sh, d, c)
    assert_matches_reference(got, run(reference, enc, sh, d, c, dtype=torch.float64))


@pytest.mark.parametrize("bias", [0.3, 40.0])
def test_backward_with_or_without_the_forward_outputs_gives_the_same_bits(cpu_ext, bias):
    # The autograd wrapper hands the backward the forward's sigma and rgb; without them it
    # recomputes both (and the clamped exponential where h0 - 1 > 15).
    enc, sh, d, c = field(700)
    d[-1][1][0] = bias
    mod = kernels._ext.load_cpu()
    dens, col = [t for wb in d for t in wb], [t for wb in c for t in wb]
    sigma, rgb = mod.nerf_mlp_forward(enc, sh, dens, col, 1.0, 0, -1)
    g = torch.Generator().manual_seed(3)
    g_sigma, g_rgb = torch.randn(700, generator=g), torch.randn(700, 3, generator=g)

    def backward(s, r):
        return mod.nerf_mlp_backward(
            enc, sh, dens, col, 1.0, s, r, g_sigma, g_rgb, True, True, True, 0, -1
        )

    assert_same_bits(backward(sigma, rgb), backward(None, None))


def test_empty_and_single_row(cpu_ext):
    enc, sh, d, c = field(0)
    params = [t.requires_grad_(True) for wb in d + c for t in wb]
    sigma, rgb = kernels.nerf_mlp(enc.requires_grad_(True), d, sh, c)
    assert sigma.shape == (0,) and rgb.shape == (0, 3)
    grads = torch.autograd.grad([sigma.sum() + rgb.sum()], [enc, *params])
    assert grads[0].shape == (0, 32)
    assert all(g.shape == p.shape and not g.any() for g, p in zip(grads[1:], params))
    case = field(1)
    assert_matches_reference(run(ext(), *case), run(reference, *case, dtype=torch.float64))


def test_non_contiguous_inputs(cpu_ext):
    enc, sh, d, c = field(333)
    wide = torch.cat([enc, torch.randn(333, 5)], 1)[:, :32]  # row stride 37
    sh_t = sh.t().contiguous().t()  # column-major
    d_t = [(w.t().contiguous().t(), b) for w, b in d]
    c_t = [(w.t().contiguous().t(), torch.stack([b, b], 1)[:, 0]) for w, b in c]
    assert not (wide.is_contiguous() or sh_t.is_contiguous() or d_t[0][0].is_contiguous())
    assert_same_bits(run(ext(), wide, sh_t, d_t, c_t), run(ext(), enc, sh, d, c))


@pytest.mark.parametrize("isa", ISAS)
def test_thread_count_gives_the_same_bits(cpu_ext, isa):
    case = field(5000)  # five gradient groups
    torch.set_num_threads(1)
    one = run(ext(0, isa), *case)
    torch.set_num_threads(2)
    two = run(ext(0, isa), *case)
    assert_same_bits(one, two)
    assert_matches_reference(one, run(reference, *case, dtype=torch.float64))


def test_avx2_and_avx512_give_the_same_bits(cpu_ext):
    # Both multiply-add in the same order with fused multiply-adds; only the vector width differs.
    if 256 not in ISAS or 512 not in ISAS:
        pytest.skip("needs AVX-512")
    case = field(2100)
    assert_same_bits(run(ext(0, 512), *case), run(ext(0, 256), *case))


def test_outputs_do_not_depend_on_the_block(cpu_ext):
    # Each row is computed alone; only the order of the weight-gradient sums changes.
    case = field(700)
    runs = [run(ext(block), *case) for block in (1, 16, 100, 0)]
    for r in runs[1:]:
        assert_same_bits(r[:2], runs[0][:2])
        assert_matches_reference(r, [x.double() for x in runs[0]])


def test_frozen_networks_still_give_the_encoding_gradient(cpu_ext):
    enc, sh, d, c = field(400)
    e = enc.clone().requires_grad_(True)
    sigma, rgb = kernels.nerf_mlp(e, d, sh, c)  # no weight requires grad
    (g,) = torch.autograd.grad([sigma.sum() + rgb.sum()], [e])
    r = enc.double().requires_grad_(True)
    dd = [(w.double(), b.double()) for w, b in d]
    cc = [(w.double(), b.double()) for w, b in c]
    s_ref, rgb_ref = kernels.nerf_mlp_reference(r, dd, sh.double(), cc)
    (g_ref,) = torch.autograd.grad([s_ref.sum() + rgb_ref.sum()], [r])
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-4, atol=1e-5 * float(g_ref.abs().max()))


def test_an_unused_output_counts_as_zero_gradient(cpu_ext):
    enc, sh, d, c = field(300)
    e = enc.clone().requires_grad_(True)
    sigma, _ = kernels.nerf_mlp(e, d, sh, c)
    (g,) = torch.autograd.grad([sigma.sum()], [e])
    r = enc.clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad([kernels.nerf_mlp_reference(r, d, sh, c)[0].sum()], [r])
    torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-5 * float(g_ref.abs().max()))


def test_bad_arguments_are_refused(cpu_ext):
    enc, sh, d, c = field(10)
    with pytest.raises(ValueError, match="sh and color together"):
        kernels.nerf_mlp(enc, d, sh, None)
    with pytest.raises(ValueError, match="first weight must have shape"):
        kernels.nerf_mlp(enc[:, :31], d, sh, c)
    with pytest.raises(ValueError, match=r"weight must have shape \(64, 30\)"):
        kernels.nerf_mlp(enc, d, sh[:, :15], c)
    with pytest.raises(ValueError, match="end in 3 outputs"):
        kernels.nerf_mlp(enc, d, sh, [*c[:-1], (c[-1][0][:2], c[-1][1][:2])])
    with pytest.raises(ValueError, match="sh must have shape"):
        kernels.nerf_mlp(enc, d, sh[:9], c)
    with pytest.raises(ValueError, match="bias must have shape"):
        kernels.nerf_mlp(enc, [(d[0][0], d[0][1][:5]), d[1]], sh, c)
    with pytest.raises(ValueError, match="enc must be Float"):
        kernels.nerf_mlp(enc.double(), d, sh, c)
    with pytest.raises(ValueError, match=r"1..16 \(weight, bias\) pairs"):
        kernels.nerf_mlp(enc, [d[0]] + [(torch.eye(64), torch.zeros(64))] * 16 + [d[1]], sh, c)
    with pytest.raises(ValueError, match="at least one layer"):
        kernels.nerf_mlp(enc, [], sh, c)
    mod = kernels._ext.load_cpu()
    args = (enc, sh, [t for wb in d for t in wb], [t for wb in c for t in wb], 1.0)
    with pytest.raises(ValueError, match="isa must be"):
        mod.nerf_mlp_forward(*args, 0, 128)
    with pytest.raises(ValueError, match="block must be"):
        mod.nerf_mlp_forward(*args, -1, -1)


def test_reference_backend_is_the_reference():
    enc, sh, d, c = field(50)
    a = kernels.nerf_mlp(enc, d, sh, c, backend="reference")
    b = kernels.nerf_mlp_reference(enc, d, sh, c)
    assert_same_bits(a, b)


def test_isa_is_named(cpu_ext):
    assert kernels.mlp_isa() in ("avx512", "avx2", "portable")
