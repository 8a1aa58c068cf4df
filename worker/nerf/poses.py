"""Render cameras: request cameras (dataset world frame) -> normalised c2w, intrinsics, orbits."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def look_at(eye, target, up=(0.0, 1.0, 0.0)) -> np.ndarray:
    """c2w 4x4, OpenGL axes (the camera looks down -z, +y is up in the image)."""
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    fwd = target - eye
    fwd /= np.linalg.norm(fwd)
    right = np.cross(fwd, up)
    right /= np.linalg.norm(right)
    true_up = np.cross(right, fwd)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, true_up, -fwd, eye
    return m


def camera_c2w(camera: dict[str, Any]) -> np.ndarray:
    """A request camera ({c2w} or {look_at}) as a rigid 4x4 in the dataset's world frame."""
    if camera.get("c2w") is not None:
        m = np.asarray(camera["c2w"], dtype=np.float64)
        out = np.eye(4)
        out[:3, :] = m[:3, :]
        # Re-orthonormalise: clients send rounded matrices; a scaled rotation would bend rays.
        u, _, vt = np.linalg.svd(out[:3, :3])
        r = u @ vt
        if np.linalg.det(r) < 0:
            raise ValueError("c2w rotation is a reflection (determinant < 0)")
        if np.abs(out[:3, :3] - r).max() > 1e-2:
            raise ValueError("c2w is not a rigid transform (its 3x3 part is not a rotation)")
        out[:3, :3] = r
        return out
    la = camera["look_at"]
    return look_at(la["eye"], la["target"], la.get("up", (0.0, 1.0, 0.0)))


def normalize_c2w(c2w: np.ndarray, normalization: dict[str, Any]) -> np.ndarray:
    """The stored intake rule: p_normalised = (p_world - offset) * scale, rotation unchanged."""
    out = np.array(c2w, dtype=np.float64)
    out[:3, 3] = (out[:3, 3] - np.asarray(normalization["offset"], dtype=np.float64)) * float(normalization["scale"])
    return out


def intrinsics(request: dict[str, Any], width: int, height: int, default: dict[str, Any]) -> tuple[float, ...]:
    """(fx, fy, cx, cy) in pixels of the requested size. Without any, the training camera's field
    of view is kept (its focal length scaled to the new width)."""
    fx, fy = request.get("fx"), request.get("fy")
    if request.get("fov_x_deg") is not None:
        fx = 0.5 * width / math.tan(math.radians(request["fov_x_deg"]) / 2)
    if request.get("fov_y_deg") is not None:
        fy = 0.5 * height / math.tan(math.radians(request["fov_y_deg"]) / 2)
    if fx is None and fy is None:
        fx = default["fx"] * width / default["w"]
        fy = default["fy"] * width / default["w"]
    fx = fx if fx is not None else fy
    fy = fy if fy is not None else fx
    cx = request.get("cx", width / 2)
    cy = request.get("cy", height / 2)
    return float(fx), float(fy), float(cx), float(cy)


def orbit_poses(orbit: dict[str, Any]) -> list[np.ndarray]:
    """n_frames cameras on a circle about `center` (around the `up` axis) at `elevation_deg`,
    all looking at the centre; frame 0 sits on the side of the first axis perpendicular to up."""
    center = np.asarray(orbit.get("center", (0.0, 0.0, 0.0)), dtype=np.float64)
    up = np.asarray(orbit.get("up", (0.0, 1.0, 0.0)), dtype=np.float64)
    up /= np.linalg.norm(up)
    radius = float(orbit["radius"])
    elev = math.radians(float(orbit.get("elevation_deg", 20.0)))
    n = int(orbit.get("n_frames", 36))
    # Any fixed direction not parallel to up gives the circle's first axis.
    ref = np.array([1.0, 0.0, 0.0]) if abs(up[0]) < 0.9 else np.array([0.0, 0.0, 1.0])
    e1 = ref - up * (ref @ up)
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(up, e1)
    poses = []
    for k in range(n):
        phi = 2 * math.pi * k / n
        direction = math.cos(elev) * (math.cos(phi) * e1 + math.sin(phi) * e2) + math.sin(elev) * up
        poses.append(look_at(center + radius * direction, center, up))
    return poses
