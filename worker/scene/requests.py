"""Render requests of the scene kinds (nerf, splat): request cameras (dataset world frame) ->
normalised RenderCameras, camera clean-up, and the rgb / depth / alpha outputs, so every kind
answers the same request the same way. Requests arrive as the task's typed `api_schemas.render`
models (RenderRequest, PathRequest), validated at the worker's boundary (worker.tasks)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from api_schemas.camera import Orbit, Pose
from api_schemas.render import PathRequest, RenderRequest
from core.scene_format import REQUEST_RIGID_TOL
from worker.errors import RenderError
from worker.scene.cameras import (
    RenderCamera,
    as_c2w,
    focal_from_fov,
    fov_from_focal,
    look_at,
    normalize_pose,
    orbit_poses,
)
from worker.scene.encode import (
    CONTENT_TYPES,
    depth_npy,
    depth_png16,
    encode_image,
    to_uint8,
)


class Intrinsics(Protocol):
    """What intrinsics resolve from: a render request (api_schemas.render.Intrinsics) or a full
    api_schemas.camera.Camera."""

    fov_x_deg: float | None
    fov_y_deg: float | None
    fx: float | None
    fy: float | None
    cx: float | None
    cy: float | None


# A path may not ask for more than this many render-limit frames in total (time, memory).
PATH_PIXEL_BUDGET_FRAMES = 64


def output_pixels(rgb, depth, alpha, output: str) -> tuple[np.ndarray, dict[str, str]]:
    """uint8 pixels of the requested output and the PNG text that explains them."""
    if output == "rgb":
        return to_uint8(rgb), {}
    if output == "alpha":
        return to_uint8(alpha), {"nf-output": "alpha"}
    # Depth: near -> 255 ... far -> 1 (linear in world units); 0 = no surface.
    hit = alpha > 0.5
    if not hit.any():
        return np.zeros(depth.shape, np.uint8), {
            "nf-output": "depth",
            "nf-depth-near": "0",
            "nf-depth-far": "0",
        }
    near, far = float(depth[hit].min()), float(depth[hit].max())
    span = max(far - near, 1e-9)
    img = np.where(hit, 255.0 - 254.0 * (depth - near) / span, 0.0)
    return np.clip(np.round(img), 0, 255).astype(np.uint8), {
        "nf-output": "depth",
        "nf-depth-near": f"{near:.6g}",
        "nf-depth-far": f"{far:.6g}",
        "nf-depth-rule": "value = 255 - 254 * (depth - near) / (far - near); 0 = no surface; world units",
    }


def encode_output(
    rgb, depth, alpha, output: str, fmt: str, text: dict[str, str] | None = None
) -> tuple[bytes, str]:
    """One rendered view as the bytes of the requested output and format, and their content type.
    depth (world units) also comes as `png16` (millimetres) or `npy` (float32)."""
    if fmt in ("png16", "npy"):
        if output != "depth":
            raise RenderError(422, f"format {fmt} holds depth; ask for output depth")
        hit = alpha > 0.5
        data = depth_png16(depth, hit) if fmt == "png16" else depth_npy(depth, hit)
        return data, CONTENT_TYPES[fmt]
    pixels, extra = output_pixels(rgb, depth, alpha, output)
    return encode_image(pixels, fmt, {**(text or {}), **extra}), CONTENT_TYPES[fmt]


def rigid_c2w(c2w, what: str) -> list[list[float]]:
    """A request c2w re-orthonormalised (clients send rounded matrices; a scaled rotation would
    bend rays); RenderError for reflections and matrices that are not rigid at all."""
    m = np.asarray(c2w, dtype=np.float64)
    u, _, vt = np.linalg.svd(m[:3, :3])
    r = u @ vt
    # The API's measure and tolerance (api_schemas.camera.check_c2w): both sides agree.
    gram_error = np.abs(m[:3, :3].T @ m[:3, :3] - np.eye(3)).max()
    if np.linalg.det(r) < 0 or gram_error > REQUEST_RIGID_TOL:
        raise RenderError(
            422, f"{what}: c2w is not a rigid transform (its 3x3 part must be a rotation)"
        )
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = r, m[:3, 3]
    return out.tolist()


def clean_camera(cam: Pose | None, what: str) -> Pose:
    """A request's pose with its c2w made rigid (rigid_c2w); RenderError when there is none."""
    if cam is None:
        raise RenderError(
            422, "scene renders need a camera: {c2w: 4x4} or {look_at: {eye, target, up}}"
        )
    if cam.c2w is None:
        return cam
    return cam.model_copy(update={"c2w": rigid_c2w(cam.c2w, what)})


# -- request cameras -> normalised cameras --------------------------------------------------
# The field of view of a request without intrinsics where no training camera is known (a
# checkpoint whose meta records none): about a phone camera's.
FALLBACK_FOV_X_DEG = 50.0
# The up of look_at and orbits without one where the dataset records none: Blender's z-up.
FALLBACK_WORLD_UP = (0.0, 0.0, 1.0)


def default_fov_x_deg(meta: dict) -> float:
    """The median horizontal fov of the training cameras, for requests that give no intrinsics."""
    fovs = sorted(
        fov_from_focal(f["fx"], f["w"]) for f in meta["frames"] if f.get("split") == "train"
    )
    return fovs[len(fovs) // 2] if fovs else FALLBACK_FOV_X_DEG


def resolve_intrinsics(intr: Intrinsics, width: int, height: int, meta: dict | None = None):
    """(fx, fy, cx, cy) from a request's fov_x_deg | fov_y_deg | fx/fy/cx/cy (the intrinsics of
    api_schemas.render's requests, or of an api_schemas.camera.Camera)."""
    if intr.fx is not None or intr.fy is not None:
        fx = intr.fx if intr.fx is not None else intr.fy
        fy = intr.fy if intr.fy is not None else fx
    elif intr.fov_y_deg is not None:
        fx = fy = focal_from_fov(intr.fov_y_deg, height)
    else:
        fov = intr.fov_x_deg or (default_fov_x_deg(meta) if meta else FALLBACK_FOV_X_DEG)
        fx = fy = focal_from_fov(fov, width)
    cx = intr.cx if intr.cx is not None else width / 2
    cy = intr.cy if intr.cy is not None else height / 2
    return float(fx), float(fy), float(cx), float(cy)


def world_up(up, meta: dict):
    """A request's up, else the dataset's world up."""
    return up or meta.get("world_up") or FALLBACK_WORLD_UP


def resolve_pose(pose: Pose, meta: dict) -> torch.Tensor:
    """World-frame c2w of a request's c2w | look_at (up defaults to the dataset's world_up)."""
    if pose.c2w is not None:
        return as_c2w(pose.c2w)
    la = pose.look_at
    return look_at(la.eye, la.target, world_up(la.up, meta))


def resolve_camera(
    pose: Pose, intr: Intrinsics, width: int, height: int, meta: dict
) -> RenderCamera:
    """A request's pose and intrinsics at width x height -> normalised pose + intrinsics."""
    fx, fy, cx, cy = resolve_intrinsics(intr, width, height, meta)
    c2w = normalize_pose(resolve_pose(pose, meta), meta["normalization"])
    return RenderCamera(c2w, fx, fy, cx, cy, int(width), int(height))


def resolve_request_camera(request: RenderRequest, meta: dict) -> RenderCamera:
    """A RenderRequest's camera (pose under `camera`, intrinsics and size beside it)."""
    pose = clean_camera(request.camera, "camera")
    return resolve_camera(pose, request, request.width, request.height, meta)


def path_length(request: PathRequest) -> tuple[int, int, int]:
    """(width, height, frames) of a PathRequest."""
    return int(request.width), int(request.height), request.frames


def path_cameras(request: PathRequest, meta: dict) -> list[RenderCamera]:
    """A PathRequest's cameras: its `orbit`, its `poses`, or its nerfstudio `camera_path` in
    its `frame`."""
    w, h, _ = path_length(request)
    if request.camera_path is not None:
        return nerfstudio_cameras(request, w, h, meta)
    if request.orbit is not None:
        return orbit_cameras(request.orbit, request, w, h, meta)
    poses = [clean_camera(p, f"poses[{i}]") for i, p in enumerate(request.poses or [])]
    return [resolve_camera(p, request, w, h, meta) for p in poses]


# -- nerfstudio camera paths ------------------------------------------------------------------
def nerfstudio_cameras(request: PathRequest, width: int, height: int, meta: dict):
    """nerfstudio's camera_path.json (as `ns-render camera-path` reads it): `camera_to_world` is
    a row-major 4x4 c2w with OpenGL axes, `fov` the vertical field of view in degrees, the
    principal point the image centre; `aspect` and the viewer's keys are not needed.
    `frame` says where the poses live: "world" (the dataset's own frame, as every other request)
    or "nerfstudio" (nerfstudio's normalised frame: the request's `dataparser_transform`, as
    nerfstudio writes it to dataparser_transforms.json, else the one nerfstudio's default
    dataparser makes from this dataset's cameras, `nerfstudio_transform`)."""
    frame = request.frame
    if frame not in ("world", "nerfstudio"):
        raise RenderError(422, "camera_path needs frame: world or nerfstudio")
    to_world = None
    if frame == "nerfstudio":
        dt = request.dataparser_transform
        if dt is not None:
            t, scale = np.asarray(dt.transform, dtype=np.float64), float(dt.scale)
        else:
            t, scale = nerfstudio_transform(_world_poses(meta))
        to_world = np.linalg.inv(np.vstack([t, [0.0, 0.0, 0.0, 1.0]])), scale
    cams = []
    for i, entry in enumerate(request.camera_path.camera_path):
        m = np.asarray(entry.camera_to_world, dtype=np.float64).reshape(4, 4)
        if to_world is not None:
            inv, scale = to_world
            m = m.copy()
            m[:3, 3] /= scale
            m = inv @ m
        c2w = rigid_c2w(m, f"camera_path[{i}]")
        f = focal_from_fov(float(entry.fov), height)
        cams.append(
            RenderCamera(
                normalize_pose(c2w, meta["normalization"]),
                f,
                f,
                width / 2,
                height / 2,
                width,
                height,
            )
        )
    return cams


def _world_poses(meta: dict) -> np.ndarray:
    """(N, 4, 4) world-frame c2w of every dataset camera (all splits, as nerfstudio sees them)."""
    frames = meta.get("all_frames")
    if frames is None:
        from worker.scene.dataset import read_meta

        if not meta.get("dataset_dir"):
            raise RenderError(
                422, "this job's dataset cameras are not available for frame nerfstudio"
            )
        frames = read_meta(meta["dataset_dir"])["frames"]
        meta["all_frames"] = frames  # the model's camera_meta lives as long as its checkpoint
    n = meta["normalization"]
    poses = np.asarray([f["c2w"] for f in frames], dtype=np.float64)
    poses[:, :3, 3] = poses[:, :3, 3] / float(n["scale"]) + np.asarray(n["offset"])
    return poses


def _rotation_between(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Rotation taking direction a to b (Rodrigues), as nerfstudio's rotation_matrix_between."""
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
    v = np.cross(a, b)
    if np.linalg.norm(v) < 1e-6:  # a and b (anti)parallel: any axis perpendicular to a
        x = np.array([1.0, 0, 0]) if abs(a[0]) < 0.9 else np.array([0, 1.0, 0])
        v = np.cross(a, x)
    v = v / np.linalg.norm(v)
    k = np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])
    theta = np.arccos(np.clip(a @ b, -1.0, 1.0))
    return np.eye(3) + np.sin(theta) * k + (1 - np.cos(theta)) * (k @ k)


def nerfstudio_transform(poses: np.ndarray) -> tuple[np.ndarray, float]:
    """The (3x4 transform, scale) nerfstudio's nerfstudio-data dataparser derives with its
    defaults (orientation_method "up", center_method "poses", auto_scale_poses): centre on the
    mean camera position, rotate the mean camera up to +z, scale the largest coordinate to 1.
    A nerfstudio-frame point is scale * (transform @ [p_world, 1])."""
    origins = poses[:, :3, 3]
    centre = origins.mean(axis=0)
    up = poses[:, :3, 1].mean(axis=0)
    r = _rotation_between(up, np.array([0.0, 0.0, 1.0]))
    t = np.hstack([r, (r @ -centre)[:, None]])
    oriented = (origins - centre) @ r.T
    return t, 1.0 / float(np.abs(oriented).max())


def orbit_cameras(
    orbit: Orbit, intrinsics: Intrinsics, width: int, height: int, meta: dict
) -> list[RenderCamera]:
    """api_schemas.camera.Orbit (world frame) -> normalised RenderCameras."""
    poses = orbit_poses(
        orbit.center,
        orbit.radius,
        orbit.elevation_deg,
        orbit.n_frames,
        world_up(orbit.up, meta),
        orbit.start_azimuth_deg,
    )
    fx, fy, cx, cy = resolve_intrinsics(intrinsics, width, height, meta)
    return [
        RenderCamera(normalize_pose(p, meta["normalization"]), fx, fy, cx, cy, width, height)
        for p in poses
    ]
