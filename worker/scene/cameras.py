"""Camera math shared by the scene kinds (torch).

Conventions (docs/architecture.md): c2w is camera-to-world, OpenGL axes (x right, y up, the camera
looks down -z); pixel (i, j) has its centre at (i + 0.5, j + 0.5), j counting rows from the top;
distortion is OpenCV's (k1, k2, k3, p1, p2), or for OPENCV_FISHEYE frames the equidistant k1..k4,
on normalised coordinates with y pointing down.
Poses in requests are in the dataset's world frame; `normalize_pose` maps them into the frame the
scene was trained in, with the `normalization` stored in dataset/cameras.json.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

Tensorish = torch.Tensor | Sequence[float] | Sequence[Sequence[float]]


def _t(x: Tensorish, dtype=torch.float64) -> torch.Tensor:
    return torch.as_tensor(x, dtype=dtype)


# --------------------------------------------------------------------------- poses


def look_at(eye: Tensorish, target: Tensorish, up: Tensorish = (0.0, 0.0, 1.0)) -> torch.Tensor:
    """c2w (4x4 float64) for a camera at `eye` looking at `target`, image-up as close to `up` as possible."""
    eye, target, up = _t(eye), _t(target), _t(up)
    fwd = target - eye
    if fwd.norm() < 1e-12:
        raise ValueError("eye and target are the same point")
    fwd = fwd / fwd.norm()
    right = torch.linalg.cross(fwd, up)
    if right.norm() < 1e-9 * max(float(up.norm()), 1e-300):
        raise ValueError("up is parallel to the viewing direction")
    right = right / right.norm()
    cam_up = torch.linalg.cross(right, fwd)
    m = torch.eye(4, dtype=torch.float64)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, cam_up, -fwd, eye
    return m


def as_c2w(m: Tensorish) -> torch.Tensor:
    """4x4 float64 from a 4x4 or 3x4 matrix."""
    m = _t(m)
    if m.shape[-2:] == (3, 4):
        bottom = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=m.dtype).expand(*m.shape[:-2], 1, 4)
        m = torch.cat([m, bottom], -2)
    if m.shape[-2:] != (4, 4):
        raise ValueError(f"expected a 4x4 or 3x4 matrix, got {tuple(m.shape)}")
    return m


def normalize_pose(c2w_world: Tensorish, normalization: dict) -> torch.Tensor:
    """World-frame pose(s) (..., 4, 4) -> the normalised frame: p_n = (p_w - offset) * scale."""
    m = as_c2w(c2w_world).clone()
    off = _t(normalization["offset"])
    m[..., :3, 3] = (m[..., :3, 3] - off) * float(normalization["scale"])
    return m


def denormalize_pose(c2w_norm: Tensorish, normalization: dict) -> torch.Tensor:
    m = as_c2w(c2w_norm).clone()
    off = _t(normalization["offset"])
    m[..., :3, 3] = m[..., :3, 3] / float(normalization["scale"]) + off
    return m


def normalize_points(p_world: Tensorish, normalization: dict) -> torch.Tensor:
    return (_t(p_world) - _t(normalization["offset"])) * float(normalization["scale"])


def world_distance(d_norm: torch.Tensor, normalization: dict) -> torch.Tensor:
    """A length measured in the normalised frame (e.g. a rendered depth) in world units."""
    return d_norm / float(normalization["scale"])


def orbit_poses(
    center: Tensorish,
    radius: float,
    elevation_deg: float,
    n_frames: int,
    up: Tensorish = (0.0, 0.0, 1.0),
    start_azimuth_deg: float = 0.0,
) -> torch.Tensor:
    """(n, 4, 4) cameras evenly spaced in azimuth on a circle around `center`, looking at it."""
    c, up = _t(center), _t(up)
    up = up / up.norm()
    # Azimuth 0 points along the world axis least aligned with `up`, made perpendicular to it.
    axis = torch.eye(3, dtype=torch.float64)[int(torch.argmin(up.abs()))]
    e1 = axis - (axis @ up) * up
    e1 = e1 / e1.norm()
    e2 = torch.linalg.cross(up, e1)
    el = math.radians(elevation_deg)
    poses = []
    for k in range(n_frames):
        az = math.radians(start_azimuth_deg) + 2 * math.pi * k / n_frames
        d = math.cos(el) * (math.cos(az) * e1 + math.sin(az) * e2) + math.sin(el) * up
        poses.append(look_at(c + radius * d, c, up))
    return torch.stack(poses)


# --------------------------------------------------------------------------- intrinsics and rays


def focal_from_fov(fov_deg: float, size: int) -> float:
    """Focal length in pixels for a field of view spanning `size` pixels."""
    return 0.5 * size / math.tan(math.radians(fov_deg) / 2)


def fov_from_focal(focal: float, size: int) -> float:
    return math.degrees(2 * math.atan(0.5 * size / focal))


def distort(x: torch.Tensor, y: torch.Tensor, dist: torch.Tensor):
    """OpenCV distortion of normalised (x, y) (y down); dist (..., 5) = k1, k2, k3, p1, p2."""
    k1, k2, k3, p1, p2 = dist.unbind(-1)
    r2 = x * x + y * y
    radial = 1 + r2 * (k1 + r2 * (k2 + r2 * k3))
    xd = x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x)
    yd = y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y
    return xd, yd


def undistort(xd: torch.Tensor, yd: torch.Tensor, dist: torch.Tensor, iters: int = 12):
    """Inverse of `distort` by fixed-point iteration (as OpenCV's undistortPoints)."""
    k1, k2, k3, p1, p2 = dist.unbind(-1)
    x, y = xd, yd
    for _ in range(iters):
        r2 = x * x + y * y
        radial = 1 + r2 * (k1 + r2 * (k2 + r2 * k3))
        dx = 2 * p1 * x * y + p2 * (r2 + 2 * x * x)
        dy = p1 * (r2 + 2 * y * y) + 2 * p2 * x * y
        x, y = (xd - dx) / radial, (yd - dy) / radial
    return x, y


def fisheye_distort(x: torch.Tensor, y: torch.Tensor, k: torch.Tensor):
    """OpenCV fisheye (Kannala-Brandt equidistant) distortion of normalised pinhole (x, y)
    (y down): theta_d = theta (1 + k1 theta^2 + k2 theta^4 + k3 theta^6 + k4 theta^8).

    Args: x, y (...,); k (..., 4) = k1..k4. Returns distorted (xd, yd), each (...,).
    """
    k1, k2, k3, k4 = k.unbind(-1)
    r = torch.sqrt(x * x + y * y)
    theta = torch.atan(r)
    t2 = theta * theta
    theta_d = theta * (1 + t2 * (k1 + t2 * (k2 + t2 * (k3 + t2 * k4))))
    s = torch.where(r > 1e-12, theta_d / r.clamp_min(1e-12), torch.ones_like(r))
    return x * s, y * s


def fisheye_directions(xd: torch.Tensor, yd: torch.Tensor, k: torch.Tensor, iters: int = 12):
    """Inverse of `fisheye_distort` as camera-frame directions, so rays past 90 degrees off axis
    stay finite: theta from theta_d by Newton's method (as OpenCV's fisheye::undistortPoints).

    Args: xd, yd (...,) distorted normalised coordinates (y down); k (..., 4) = k1..k4.
    Returns (x, y, z) (...,) each: a unit direction, y down, z along the optical axis.
    """
    k1, k2, k3, k4 = k.unbind(-1)
    theta_d = torch.sqrt(xd * xd + yd * yd)
    theta = theta_d.clone()
    for _ in range(iters):
        t2 = theta * theta
        f = theta * (1 + t2 * (k1 + t2 * (k2 + t2 * (k3 + t2 * k4)))) - theta_d
        df = 1 + t2 * (3 * k1 + t2 * (5 * k2 + t2 * (7 * k3 + t2 * 9 * k4)))
        theta = theta - f / df
    theta = theta.clamp(0, math.pi)
    s = torch.where(
        theta_d > 1e-12, torch.sin(theta) / theta_d.clamp_min(1e-12), torch.ones_like(theta)
    )
    return xd * s, yd * s, torch.cos(theta)


def rays_from_pixels(
    c2w: torch.Tensor,
    intrinsics: torch.Tensor,
    px: torch.Tensor,
    py: torch.Tensor,
    distortion: torch.Tensor | None = None,
    fisheye: torch.Tensor | None = None,
):
    """Rays through pixel coordinates (px, py) (pixel centres are integer + 0.5).

    c2w (N, 3|4, 4), intrinsics (N, 4) = fx, fy, cx, cy, px/py (N,), distortion (N, 5) or None:
    OpenCV k1, k2, k3, p1, p2, or where `fisheye` (N,) bool is set, fisheye k1..k4 and a 0;
    everything broadcastable over N. Returns float32 origins (N, 3) and unit directions (N, 3).
    """
    c2w = c2w.to(torch.float32)
    intrinsics = intrinsics.to(torch.float32)
    fx, fy, cx, cy = intrinsics.unbind(-1)
    x = (px.to(torch.float32) - cx) / fx
    y = (py.to(torch.float32) - cy) / fy  # OpenCV: y down
    z = torch.ones_like(x)
    if distortion is None and fisheye is not None and bool(fisheye.any()):
        distortion = torch.zeros(5, device=x.device)  # an ideal fisheye lens: r = f * theta
    if distortion is not None:
        dist = distortion.to(torch.float32)
        if fisheye is None or not bool(fisheye.any()):
            x, y = undistort(x, y, dist)
        else:
            fe = fisheye.to(torch.bool)
            ux, uy = undistort(x, y, torch.where(fe[..., None], torch.zeros_like(dist), dist))
            fx_, fy_, fz_ = fisheye_directions(x, y, dist[..., :4])
            x, y, z = torch.where(fe, fx_, ux), torch.where(fe, fy_, uy), torch.where(fe, fz_, z)
    d_cam = torch.stack([x, -y, -z], -1)  # to OpenGL: y up, looking down -z
    d = torch.einsum("...ij,...j->...i", c2w[..., :3, :3], d_cam)
    d = d / d.norm(dim=-1, keepdim=True)
    o = c2w[..., :3, 3].expand_as(d)
    return o.contiguous(), d.contiguous()


def pixel_grid(width: int, height: int, device=None):
    """Pixel-centre coordinates (H*W,) px, py, row-major from the top-left pixel."""
    j, i = torch.meshgrid(
        torch.arange(height, device=device, dtype=torch.float32),
        torch.arange(width, device=device, dtype=torch.float32),
        indexing="ij",
    )
    return i.reshape(-1) + 0.5, j.reshape(-1) + 0.5


def image_rays(
    c2w: Tensorish,
    fx: float,
    fy: float,
    cx: float,
    cy: float,
    width: int,
    height: int,
    distortion: Tensorish | None = None,
    device=None,
    fisheye: bool = False,
):
    """All rays of one image, (H*W, 3) origins and unit directions, row-major."""
    px, py = pixel_grid(width, height, device)
    c2w = as_c2w(c2w).to(device)
    intr = torch.tensor([fx, fy, cx, cy], device=device)
    dist = None if distortion is None else _t(distortion, torch.float32).to(device)
    fe = torch.tensor(fisheye, device=device) if fisheye else None
    return rays_from_pixels(c2w, intr, px, py, dist, fe)


@dataclass
class RenderCamera:
    """A pinhole camera in the normalised (training) frame: what renderers and the splat
    rasteriser take."""

    c2w: torch.Tensor  # (4, 4), normalised frame, OpenGL axes
    fx: float
    fy: float
    cx: float
    cy: float
    width: int
    height: int

    def rays(self, device=None):
        return image_rays(
            self.c2w, self.fx, self.fy, self.cx, self.cy, self.width, self.height, device=device
        )
