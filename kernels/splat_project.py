"""EWA projection of 3D Gaussians to the 2D splats `kernels.splat.rasterize` composites (torch, autograd).

Cameras follow the project's convention: c2w camera-to-world with OpenGL axes (x right, y up,
looking down -z), pinhole fx, fy, cx, cy in pixels of an image whose pixel centres sit at +0.5.
Constants are seed 002's: a 0.3 px^2 dilation of every 2D covariance and a 0.05 near plane.
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
) -> Projected:
    """Project (N, 3) means with (N, 3, 3) covariances; differentiable w.r.t. both."""
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
    with torch.no_grad():
        mid = 0.5 * (a + c)
        lam = mid + torch.sqrt(torch.clamp(mid * mid - det, min=0.1))
        radii = torch.where(visible, 3.0 * torch.sqrt(lam), torch.zeros_like(lam))
    return Projected(means2d, conics, z, radii, visible)
