"""Where a scene's cameras sit in the normal form: rigid-pose checks, the uniform normalisation
into the [-1, 1]^3 training box, and the world up vector. numpy only.

    p_normalised = (p_world - offset) * scale          (uniform scale, no rotation)
    c2w_normalised = [[R, (t - offset) * scale], [0, 0, 0, 1]]

* instant-ngp files with `scale`/`offset`: ngp maps p -> p*s + o into its unit cube [0,1]^3; our
  box is [-1,1]^3, so scale = 2*s and offset = (0.5 - o) / s (ngp's defaults s=0.33, o=0.5 fill
  in whichever of the two is missing).
* everything else: offset = the point closest to all optical axes (where the cameras look), and
  scale = 1 / (median camera distance to it * tan(max half fov)), i.e. what a median camera sees
  at that distance fills the unit box. For the Blender scenes this gives ngp's own 0.33*2 within
  a few percent. Forward-facing captures (no common focus point) fall back to a point in front
  of the mean camera.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from core.scene_format import UPLOAD_RIGID_TOL, SceneError

NGP_DEFAULT_SCALE, NGP_DEFAULT_OFFSET = 0.33, 0.5  # instant-ngp's nerf_loader defaults
# Camera axes: OpenCV/COLMAP (x right, y down, looking down +z) -> OpenGL (y up, looking down -z).
OPENCV_TO_OPENGL = np.diag([1.0, -1.0, -1.0, 1.0])


def check_rigid(m: Any, what: str, tol: float = UPLOAD_RIGID_TOL) -> np.ndarray:
    """A 4x4 (or 3x4) rigid transform as float64 4x4, re-orthonormalised; SceneError otherwise."""
    try:
        a = np.array(m, dtype=np.float64)
    except (TypeError, ValueError):
        raise SceneError(f"{what}: transform matrix is not a 4x4 array of numbers") from None
    if a.shape not in ((4, 4), (3, 4)):
        raise SceneError(f"{what}: transform matrix must be 4x4 or 3x4, got shape {list(a.shape)}")
    if not np.isfinite(a).all():
        raise SceneError(f"{what}: transform matrix contains NaN or infinity")
    if a.shape == (4, 4) and np.abs(a[3] - [0, 0, 0, 1]).max() > 1e-4:
        raise SceneError(
            f"{what}: transform matrix last row must be [0, 0, 0, 1], got {a[3].tolist()}"
        )
    r = a[:3, :3]
    err = np.abs(r.T @ r - np.eye(3)).max()
    if err > tol or np.linalg.det(r) <= 0:
        raise SceneError(
            f"{what}: transform matrix is not rigid (rotation part is not orthonormal with "
            f"determinant +1; error {err:.3g}); scaled or mirrored cameras are not supported"
        )
    u, _, vt = np.linalg.svd(r)
    out = np.eye(4)
    out[:3, :3] = u @ vt
    out[:3, 3] = a[:3, 3]
    return out


def focus_point(c2ws: np.ndarray) -> np.ndarray | None:
    """Least-squares point closest to every camera's optical axis (OpenGL c2w, (N, 4, 4)), or
    None when the axes do not converge in front of the cameras."""
    centres, fwd = c2ws[:, :3, 3], -c2ws[:, :3, 2]
    proj = np.eye(3)[None] - fwd[:, :, None] * fwd[:, None, :]
    a, b = proj.sum(0), (proj @ centres[:, :, None]).sum(0)[:, 0]
    ev = np.linalg.eigvalsh(a)
    if ev[0] < 1e-3 * ev[-1]:
        return None
    p = np.linalg.solve(a, b)
    if np.mean(np.einsum("ij,ij->i", fwd, p - centres)) <= 0:
        return None
    return p


def ngp_normalization(
    ngp_scale: float | None, ngp_offset: list[float] | None
) -> tuple[float, np.ndarray]:
    """(scale, offset) of an instant-ngp transforms.json's `scale` / `offset`."""
    s = ngp_scale if ngp_scale is not None else NGP_DEFAULT_SCALE
    o = np.array(ngp_offset if ngp_offset is not None else [NGP_DEFAULT_OFFSET] * 3, dtype=float)
    return 2.0 * s, (0.5 - o) / s


def fit_normalization(c2ws: np.ndarray, tan_half_fov: np.ndarray) -> tuple[float, np.ndarray]:
    """(scale, offset) that puts what the cameras (OpenGL c2w (N, 4, 4)) look at in the unit box;
    `tan_half_fov` (N,) is each camera's tan(max half field of view)."""
    centres = c2ws[:, :3, 3]
    centre = focus_point(c2ws)
    if centre is None:
        spread = float(np.median(np.linalg.norm(centres - centres.mean(0), axis=1))) or 1.0
        fwd = -c2ws[:, :3, 2].mean(0)
        fwd /= max(np.linalg.norm(fwd), 1e-9)
        centre = centres.mean(0) + fwd * spread
    dist = float(np.median(np.linalg.norm(centres - centre, axis=1)))
    extent = dist * float(np.median(tan_half_fov))
    if not math.isfinite(extent) or extent <= 1e-9:
        raise SceneError("cannot normalise the scene: all cameras sit at the same point")
    return 1.0 / extent, np.asarray(centre, dtype=np.float64)


def world_up(c2ws: np.ndarray) -> np.ndarray:
    """Mean camera up vector; snapped to a world axis when within 15 degrees of one, because
    cameras spread over a sphere bias the mean while most captures are axis-aligned (Blender: +z)."""
    up = c2ws[:, :3, 1].mean(0)
    n = np.linalg.norm(up)
    if n < 1e-6:
        return np.array([0.0, 0.0, 1.0])
    up = up / n
    k = int(np.argmax(np.abs(up)))
    if abs(up[k]) > math.cos(math.radians(15)):
        up = np.eye(3)[k] * np.sign(up[k])
    return up


# How much flatter than wide the camera centres must be for the normal of their plane to be
# taken as up (ratio of the second to the third eigenvalue of their covariance).
FLAT_CAMERAS_RATIO = 4.0
# ... and that normal is up only within 45 degrees of the mean camera up: cameras walked along a
# line at several heights span a plane whose normal is where they look.
MAX_UP_TILT_COS = math.cos(math.radians(45))


def upright_rotation(c2ws: np.ndarray) -> np.ndarray:
    """The rotation that stands an SfM world (arbitrary orientation) upright: +z up, +x along the
    cameras' widest spread, the cameras looking towards +y on average. Two SfM runs of one
    capture then land in nearly one frame, and an axis-aligned scene box and occupancy grid meet
    the room as the photographer stood in it.

    Up is the normal of the plane the camera centres spread in, when they do (walked around the
    subject at about one height; FLAT_CAMERAS_RATIO) and it is within 45 degrees of the mean
    camera up, turned to the side the cameras' up vectors point to; otherwise the mean camera
    up. The mean alone leans towards what the cameras look down at: 17 degrees on
    experiments/capture_scene.py's arc, against 4 for the plane's normal.

    Args:
        c2ws: (N, 4, 4) OpenGL camera-to-world matrices.

    Returns:
        (3, 3) rotation R: p_upright = R @ p_world.
    """
    c2ws = np.asarray(c2ws, dtype=np.float64)
    mean_up = c2ws[:, :3, 1].mean(0)
    mean_up /= max(np.linalg.norm(mean_up), 1e-12)
    centres = c2ws[:, :3, 3]
    up, widest = mean_up, None
    if len(centres) >= 3:
        evals, evecs = np.linalg.eigh(np.cov(centres.T))
        widest = evecs[:, 2]
        normal = evecs[:, 0] * (1.0 if evecs[:, 0] @ mean_up >= 0 else -1.0)
        flat = evals[1] > FLAT_CAMERAS_RATIO * max(evals[0], 1e-12)
        if flat and normal @ mean_up > MAX_UP_TILT_COS:
            up = normal
    x = widest - (widest @ up) * up if widest is not None else np.zeros(3)
    if np.linalg.norm(x) < 1e-6:  # no spread across up: any horizontal axis
        x = np.cross(up, np.eye(3)[int(np.argmin(np.abs(up)))])
    x /= np.linalg.norm(x)
    y = np.cross(up, x)
    if (-c2ws[:, :3, 2].mean(0)) @ y < 0:  # cameras look towards +y
        x, y = -x, -y
    return np.stack([x, y, up])


def normalize_c2w(c2w: np.ndarray, scale: float, offset: np.ndarray) -> np.ndarray:
    out = np.array(c2w, dtype=np.float64)
    out[:3, 3] = (out[:3, 3] - offset) * scale
    return out


AABB_SCALE_MAX = 128  # instant-ngp's largest aabb_scale
# Share of the sparse points the box must hold: SfM leaves a few stray points far out.
AABB_POINTS_QUANTILE = 0.98
# Without points, the background is taken to lie as far beyond the subject as the cameras are
# from it: a room or a landscape around a capture taken from inside it.
AABB_CAMERA_REACH = 2.0


def choose_aabb_scale(
    centres: np.ndarray, points: np.ndarray | None = None, empty_background: bool = False
) -> int:
    """The scene box's half size (a power of two, 1..128) for an upload that gives none.

    The normalisation puts the subject in the unit box; what the photos also show around it
    must be inside the box too, or the field has nowhere to put it and paints it as fog in
    front of the subject. Photos of an object in empty space (a transparent or flat background)
    keep the unit box. Otherwise the box holds the cameras and AABB_POINTS_QUANTILE of the sparse
    points (SfM, COLMAP uploads), or, without points, AABB_CAMERA_REACH times the cameras'
    reach, with 5 % to spare.

    Args:
        centres: (N, 3) camera centres in the normalised frame.
        points: (M, 3) sparse points in the normalised frame, or None.
        empty_background: the photos' background is transparent or one flat colour.

    Returns:
        1, 2, 4, ... 128 (the `aabb_scale`).
    """
    if empty_background:
        return 1
    centres = np.asarray(centres, dtype=np.float64).reshape(-1, 3)
    reach = float(np.abs(centres).max()) if len(centres) else 1.0
    pts = None if points is None else np.asarray(points, dtype=np.float64).reshape(-1, 3)
    if pts is not None and len(pts):
        extent = max(reach, float(np.quantile(np.abs(pts).max(1), AABB_POINTS_QUANTILE)))
    else:
        extent = AABB_CAMERA_REACH * reach
    if not math.isfinite(extent) or extent <= 1.0:
        return 1
    return int(min(2 ** math.ceil(math.log2(1.05 * extent)), AABB_SCALE_MAX))
