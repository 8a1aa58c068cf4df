"""EWA projection of 3D Gaussians to the 2D splats `kernels.splat.rasterize` composites (torch, autograd).

Cameras follow the project's convention: c2w camera-to-world with OpenGL axes (x right, y up,
looking down -z), pinhole fx, fy, cx, cy in pixels of an image whose pixel centres sit at +0.5.
Constants are seed 002's: a 0.3 px^2 dilation of every 2D covariance and a 0.05 near plane.
`antialiased=True` is mip-splatting's 2D filter as gsplat's `antialiased` mode: the same
dilation, with each splat's opacity scaled by sqrt(det(cov2d) / det(cov2d + 0.3 I)) so that a
splat smaller than a pixel keeps its integrated weight instead of growing brighter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DILATION = 0.3
Z_NEAR = 0.05
# Jacobians are evaluated with the view direction clamped to 1.3x the image's half field of view
# (3DGS), so splats far outside the frame cannot blow up into screen-filling ellipses.
FOV_CLAMP = 1.3


@dataclass
class Projected:
    means2d: torch.Tensor  # (N, 2) pixels
    conics: torch.Tensor  # (N, 3) A, B, C of the inverse 2D covariance
    depths: torch.Tensor  # (N,) distance along the view axis
    radii: torch.Tensor  # (N,) 3-sigma radius in pixels of the larger axis (no grad)
    visible: torch.Tensor  # (N,) bool: in front of the near plane with a valid 2D covariance
    # (N,) opacity factor of the antialiasing filter (ones without it); differentiable
    compensations: torch.Tensor | None = None


def quat_to_rotmat(q: torch.Tensor) -> torch.Tensor:
    """(N, 4) quaternions (w, x, y, z), any norm -> (N, 3, 3) rotations."""
    w, x, y, z = torch.nn.functional.normalize(q, dim=-1).unbind(-1)
    return torch.stack(
        [
            1 - 2 * (y * y + z * z),
            2 * (x * y - w * z),
            2 * (x * z + w * y),
            2 * (x * y + w * z),
            1 - 2 * (x * x + z * z),
            2 * (y * z - w * x),
            2 * (x * z - w * y),
            2 * (y * z + w * x),
            1 - 2 * (x * x + y * y),
        ],
        -1,
    ).reshape(q.shape[:-1] + (3, 3))


def covariance_3d(scales: torch.Tensor, quats: torch.Tensor) -> torch.Tensor:
    """3D covariances R S S^T R^T of Gaussians.

    Args:
        scales: (N, 3) standard deviations along the Gaussian's own axes.
        quats: (N, 4) rotations (w, x, y, z), any norm.

    Returns:
        (N, 3, 3) symmetric covariances, differentiable w.r.t. both inputs.
    """
    m = quat_to_rotmat(quats) * scales[:, None, :]
    return m @ m.transpose(-1, -2)


def world_to_camera(c2w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, t) with p_cam = R p + t in OpenCV axes (x right, y down, z forward)."""
    flip = torch.diag(torch.tensor([1.0, -1.0, -1.0], dtype=c2w.dtype, device=c2w.device))
    rot_t = c2w[:3, :3].transpose(0, 1)
    r = flip @ rot_t
    return r, -(r @ c2w[:3, 3])


def project_gaussians(
    means3d: torch.Tensor,
    cov3d: torch.Tensor,
    c2w: torch.Tensor,
    fx: float,
    fy: float,
    cx: float,
    cy: float,
    width: int,
    height: int,
    near: float = Z_NEAR,
    dilation: float = DILATION,
    antialiased: bool = False,
) -> Projected:
    """EWA-project 3D Gaussians into a pinhole camera (3DGS); differentiable w.r.t. means and covs.

    Args:
        means3d: (N, 3) world-space centres.
        cov3d: (N, 3, 3) world-space covariances.
        c2w: (4, 4) camera-to-world, OpenGL axes (columns right, up, back).
        fx, fy, cx, cy: intrinsics in pixels (v grows downwards).
        width, height: image size in pixels (bounds the Jacobian's field-of-view clamp).
        near: Gaussians at or closer than this depth are not visible.
        dilation: added to the 2D covariance's diagonal (3DGS's 0.3 px low-pass).
        antialiased: also return the filter's opacity compensations
            sqrt(det(cov2d) / det(cov2d + dilation I)) (mip-splatting, gsplat `antialiased`).

    Returns:
        Projected: means2d (N, 2), conics (N, 3), depths (N,), radii (N,), visible (N,) bool and
        compensations (N,) (ones unless antialiased); entries of invisible Gaussians are finite
        but meaningless.
    """
    c2w = torch.as_tensor(c2w, dtype=means3d.dtype, device=means3d.device)
    r, t = world_to_camera(c2w)
    p = means3d @ r.T + t
    x, y, z = p.unbind(-1)
    visible = z > near
    zs = torch.where(visible, z, torch.ones_like(z))  # keeps gradients finite behind the camera
    lim_x = FOV_CLAMP * 0.5 * width / fx
    lim_y = FOV_CLAMP * 0.5 * height / fy
    tx = torch.clamp(x / zs, -lim_x, lim_x) * zs
    ty = torch.clamp(y / zs, -lim_y, lim_y) * zs
    zero = torch.zeros_like(zs)
    jac = torch.stack(
        [
            torch.stack([fx / zs, zero, -fx * tx / (zs * zs)], -1),
            torch.stack([zero, fy / zs, -fy * ty / (zs * zs)], -1),
        ],
        -2,
    )
    tjw = jac @ r
    cov2d = tjw @ cov3d @ tjw.transpose(-1, -2)
    a = cov2d[:, 0, 0] + dilation
    b = cov2d[:, 0, 1]
    c = cov2d[:, 1, 1] + dilation
    det = a * c - b * b
    visible = visible & (det > 0)
    det_s = torch.where(visible, det, torch.ones_like(det))
    conics = torch.stack([c / det_s, -b / det_s, a / det_s], -1)
    means2d = torch.stack([fx * x / zs + cx, fy * y / zs + cy], -1)
    if antialiased:
        det_orig = cov2d[:, 0, 0] * cov2d[:, 1, 1] - b * b
        comp = torch.sqrt(torch.clamp(det_orig / det_s, min=1e-12)) * visible
    else:
        comp = torch.ones_like(z)
    with torch.no_grad():
        mid = 0.5 * (a + c)
        lam = mid + torch.sqrt(torch.clamp(mid * mid - det, min=0.1))
        radii = torch.where(visible, 3.0 * torch.sqrt(lam), torch.zeros_like(lam))
    return Projected(means2d, conics, z, radii, visible, comp)
