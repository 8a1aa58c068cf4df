"""Render-request handling shared by the scene kinds (nerf, splat): camera clean-up and the
rgb / depth / alpha encodings, so every kind answers the same request the same way."""

from __future__ import annotations

from typing import Any

import numpy as np

from worker.jobs import RenderError
from worker.nerf.encode import to_uint8

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


def rigid_c2w(c2w, what: str) -> list[list[float]]:
    """A request c2w re-orthonormalised (clients send rounded matrices; a scaled rotation would
    bend rays); RenderError for reflections and matrices that are not rigid at all."""
    m = np.asarray(c2w, dtype=np.float64)
    u, _, vt = np.linalg.svd(m[:3, :3])
    r = u @ vt
    if np.linalg.det(r) < 0 or np.abs(m[:3, :3] - r).max() > 1e-2:
        raise RenderError(
            422, f"{what}: c2w is not a rigid transform (its 3x3 part must be a rotation)"
        )
    out = np.eye(4)
    out[:3, :3], out[:3, 3] = r, m[:3, 3]
    return out.tolist()


def clean_camera(cam: dict[str, Any] | None, what: str) -> dict[str, Any]:
    if cam is None:
        raise RenderError(
            422, "scene renders need a camera: {c2w: 4x4} or {look_at: {eye, target, up}}"
        )
    return {**cam, "c2w": rigid_c2w(cam["c2w"], what)} if cam.get("c2w") is not None else cam
