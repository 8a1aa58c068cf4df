"""nerf_mlp's bfloat16 products (AVX-512 BF16) against a pure-torch emulation of them: every
matrix product of the forward and backward with both operands rounded to bfloat16 and the sums in
float64. Skipped on CPUs without AVX-512 BF16 (CI's EPYC has it)."""

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels.mlp import ISA_BF16, trunc_exp
from tests.kernels.test_mlp import assert_same_bits, ext, field, reference, run

pytestmark = pytest.mark.skipif(
    not kernels.mlp_bf16_supported(), reason="the CPU has no AVX-512 BF16"
)


def bf(t: torch.Tensor) -> torch.Tensor:
    return t.float().to(torch.bfloat16).double()


class _BfLinear(torch.autograd.Function):
    """y = x W^T + b with x and W rounded to bfloat16; its backward rounds the same way."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return bf(x) @ bf(w).t() + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return bf(g) @ bf(w), bf(g).t() @ bf(x), g.sum(0)


def _mlp(x, layers):
    for i, (w, b) in enumerate(layers):
        x = _BfLinear.apply(x, w, b)
        if i + 1 < len(layers):
            x = torch.relu(x)
    return x


def emulation(e, d, s, c, shift):
    h = _mlp(e, d)
    sigma = trunc_exp(h[:, 0] - shift)
    if s is None:
        return sigma, None
    return sigma, torch.sigmoid(_mlp(torch.cat([s, h[:, 1:]], dim=1), c))


def bf16(block=0):
    return ext(block, ISA_BF16)


def assert_matches_emulation(got, want):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == torch.float32 and a.shape == b.shape, i
        # float32 sums in another order, and an operand now and then rounded the other way from
        # a value a float32 ulp off: far below the 0.4 % of one bfloat16 rounding.
        err = float((a.double() - b).norm() / b.norm().clamp_min(1e-30))
        assert err < 2e-4, f"output/grad {i}: relative error {err:.2e}"


@pytest.mark.parametrize("n,block", [(1, 0), (37, 16), (1000, 0), (3001, 0), (300, 7)])
def test_bfloat16_products_match_their_emulation(cpu_ext, n, block):
    case = field(n)
    got = run(bf16(block), *case)
    assert_matches_emulation(got, run(emulation, *case, dtype=torch.float64))
    # ...and are not the float32 op's numbers.
    if n > 1:
        f32 = run(ext(block, 512), *case)
        assert not torch.equal(got[0], f32[0])


@pytest.mark.parametrize(
    "shape",
    [
        dict(n_in=32, dens=(), geo=15, sh_dim=16, col=()),
        dict(n_in=24, dens=(48, 40), geo=8, sh_dim=9, col=(24,)),  # odd inner sizes: 9 + 8
        dict(n_in=16, dens=(128,), geo=0, sh_dim=4, col=(72, 16, 40)),
        dict(n_in=65, dens=(512,), geo=127, sh_dim=1, col=(8,)),  # packs past the stack buffers
    ],
)
def test_other_widths_and_depths(cpu_ext, shape):
    case = field(301, **shape)
    assert_matches_emulation(run(bf16(), *case), run(emulation, *case, dtype=torch.float64))


def test_density_only(cpu_ext):
    enc, _, d, _ = field(777)
    got = run(bf16(), enc, None, d, None)
    assert_matches_emulation(got, run(emulation, enc, None, d, None, dtype=torch.float64))


def test_close_to_float64(cpu_ext):
    # What the rounding costs against exact products: bfloat16's ~0.4 % per operand, averaged.
    case = field(2000)
    for a, b in zip(run(bf16(), *case), run(reference, *case, dtype=torch.float64)):
        assert float((a.double() - b).norm() / b.norm()) < 0.1


def test_thread_count_and_block_keep_the_bits(cpu_ext):
    case = field(5000)
    torch.set_num_threads(1)
    one = run(bf16(), *case)
    torch.set_num_threads(2)
    assert_same_bits(one, run(bf16(), *case))
    assert_same_bits(one[:2], run(bf16(100), *case)[:2])


def test_precision_argument(cpu_ext):
    enc, sh, d, c = field(200)
    a = kernels.nerf_mlp(enc, d, sh, c, precision="bfloat16")
    assert_same_bits(a, bf16()(enc, d, sh, c, 1.0))
    with pytest.raises(ValueError, match="precision must be one of"):
        kernels.nerf_mlp(enc, d, sh, c, precision="float16")
    ref = kernels.nerf_mlp(enc, d, sh, c, precision="bfloat16", backend="reference")
    assert_same_bits(ref, kernels.nerf_mlp_reference(enc, d, sh, c))


def test_emulation_is_not_the_float32_reference():
    # The emulation must round: otherwise the tests above would compare with float32 numbers.
    x = torch.randn(64, 32, dtype=torch.float64)
    w, b = torch.randn(16, 32, dtype=torch.float64), torch.zeros(16, dtype=torch.float64)
    assert not torch.allclose(_BfLinear.apply(x, w, b), F.linear(x, w, b), rtol=1e-4)
