"""The antialiasing filter of kernels.splat_project (mip-splatting's 2D filter, gsplat's
`antialiased` mode): a splat keeps the image mass of its true footprint however small it gets."""

import math

import torch

from kernels import splat
from kernels.splat_project import project_gaussians
from tests.kernels.test_splat import look_at

FX, SIZE = 100.0, 32


def head_on(sigma_px: float, antialiased: bool):
    """One isotropic Gaussian at the origin seen from 3 units, sigma_px pixels wide on screen."""
    c2w = look_at([0.0, -3.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0])
    s = sigma_px * 3.0 / FX
    cov = (torch.eye(3, dtype=torch.float64) * s * s)[None].requires_grad_()
    means = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    half = SIZE / 2
    proj = project_gaussians(
        means, cov, c2w, FX, FX, half, half, SIZE, SIZE, antialiased=antialiased
    )
    return proj, means, cov


def image_mass(proj, opacity: float) -> torch.Tensor:
    _, trans = splat.rasterize(
        proj.means2d,
        proj.conics,
        torch.ones(1, 3, dtype=torch.float64),
        opacity * proj.compensations,
        SIZE,
        SIZE,
        depths=proj.depths,
        method="reference",
    )
    return (1 - trans).sum()


def test_compensation_is_the_determinant_ratio():
    for sigma in (0.1, 0.5, 3.0):
        proj, _, _ = head_on(sigma, True)
        v = sigma * sigma  # 2D variance of the head-on Gaussian, to first order
        torch.testing.assert_close(
            proj.compensations,
            torch.tensor([v / (v + 0.3)], dtype=torch.float64),
            rtol=1e-6,
            atol=0,
        )
        assert (head_on(sigma, False)[0].compensations == 1).all()


def test_sub_pixel_splat_keeps_its_true_mass():
    o, sigma = 0.99, 0.3  # a splat far smaller than a pixel; its faint rim (alpha < 1/255) is cut
    truth = o * 2 * math.pi * sigma * sigma  # integral of o * N(0, sigma^2 I) over the image plane
    aa = image_mass(head_on(sigma, True)[0], o)
    plain = image_mass(head_on(sigma, False)[0], o)
    assert abs(aa.item() / truth - 1) < 0.05, (aa.item(), truth)
    assert plain.item() / truth > 3  # the dilation alone brightens it (0.39 / 0.09 in area)
    # a large splat is left as it was
    big_aa, big = image_mass(head_on(4.0, True)[0], o), image_mass(head_on(4.0, False)[0], o)
    assert abs((big_aa / big).item() - 1) < 0.02


def test_gradients_reach_means_and_covariances():
    proj, means, cov = head_on(0.3, True)
    image_mass(proj, 0.5).backward()
    assert torch.isfinite(cov.grad).all() and cov.grad.abs().sum() > 0
    assert torch.isfinite(means.grad).all()
