import math

import pytest
import torch

import kernels


def assert_close(a, b, rtol=1e-4, atol=1e-6):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_matches_reference(cpu_ext, dtype, degree):
    d = torch.nn.functional.normalize(torch.randn(500, 3, dtype=dtype), dim=-1)
    out = kernels.sh_encode(d, degree)
    assert out.shape == (500, degree * degree)
    assert_close(out, kernels.sh_encode(d, degree, backend="reference"))


def test_addition_theorem(cpu_ext):
    # Sum of squares within band l is (2l+1)/(4 pi) for any unit direction.
    d = torch.nn.functional.normalize(torch.randn(200, 3, dtype=torch.float64), dim=-1)
    y = kernels.sh_encode(d, 4)
    for band in range(4):
        s = (y[:, band * band : (band + 1) ** 2] ** 2).sum(1)
        assert_close(s, torch.full_like(s, (2 * band + 1) / (4 * math.pi)))


def test_gradcheck(cpu_ext):
    d = torch.nn.functional.normalize(
        torch.randn(8, 3, dtype=torch.float64), dim=-1
    ).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: kernels.sh_encode(x, 4), (d,))


def test_bad_input():
    with pytest.raises(ValueError):
        kernels.sh_encode(torch.rand(4, 2))
    with pytest.raises(ValueError):
        kernels.sh_encode(torch.rand(4, 3), degree=5)
