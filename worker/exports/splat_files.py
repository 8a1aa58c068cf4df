"""Files of a splat job: the `.splat` layout web viewers load, and a point cloud of the Gaussians'
centres. (The full 3DGS PLY is worker/splat/ply.py.)

`.splat` is antimatter15/splat's format (its convert.py): 32 bytes per Gaussian, little-endian,
position 3 x f32, scale 3 x f32 (linear, not log), colour RGBA 4 x u8 (the SH DC band only, so
view-dependent colour is lost; alpha = sigmoid(opacity)), rotation 4 x u8 (w, x, y, z of the
unit quaternion, mapped as q * 128 + 128). Gaussians are sorted by importance, volume times
opacity, largest first, so a viewer that loads progressively shows the big ones first."""

from __future__ import annotations

import numpy as np
import torch

from worker.exports.common import ExportError, bounds, point_cloud_ply
from worker.splat.model import SH_C0

SPLAT_DTYPE = np.dtype(
    [("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)]
)
assert SPLAT_DTYPE.itemsize == 32


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def world_gaussians(params: dict[str, torch.Tensor], normalization: dict | None) -> dict:
    """Centres, linear scales, unit quaternions, opacities and DC colours in world units."""
    means, log_scales = _np(params["means"]), _np(params["scales"])
    if normalization is not None:
        s = float(normalization["scale"])
        means = means / s + np.asarray(normalization["offset"], np.float64)
        log_scales = log_scales - np.log(s)
    q = _np(params["quats"])
    q = q / np.clip(np.linalg.norm(q, axis=1, keepdims=True), 1e-12, None)
    return {
        "means": means,
        "log_scales": log_scales,
        "quats": q,
        "opacity": 1.0 / (1.0 + np.exp(-_np(params["opacities"]))),
        "rgb": np.clip(SH_C0 * _np(params["sh_dc"]) + 0.5, 0.0, 1.0),
    }


def world_table(
    params: dict[str, torch.Tensor], normalization: dict | None, min_opacity: float = 0.0
) -> dict:
    """world_gaussians of the Gaussians at least `min_opacity` opaque, with their SH as stored:
    `sh_dc` (n, 3) and `sh_rest` (n, K, 3), K = 0, 3, 8 or 15 (coefficient-major, RGB inner)."""
    g = world_gaussians(params, normalization)
    keep = np.flatnonzero(g["opacity"] >= min_opacity)
    out = {k: v[keep] for k, v in g.items()}
    out["sh_dc"] = _np(params["sh_dc"])[keep]
    rest = _np(params["sh_rest"])
    # K from the stored shape, not from the rows: no row may be left (-1 cannot be inferred).
    k = int(np.prod(rest.shape[1:])) // 3
    out["sh_rest"] = rest[keep].reshape(len(keep), k, 3)
    out["degree"] = {0: 0, 3: 1, 8: 2, 15: 3}[out["sh_rest"].shape[1]]
    return out


def nonempty_world_table(
    params: dict[str, torch.Tensor], normalization: dict | None, min_opacity: float = 0.0
) -> dict:
    """world_table, for the writers whose format cannot hold zero Gaussians: none left at
    `min_opacity` is the user's error (ExportError), not an empty file."""
    g = world_table(params, normalization, min_opacity)
    if len(g["means"]) == 0:
        raise ExportError(f"no Gaussian is at least {min_opacity:g} opaque: nothing to write")
    return g


def morton_order(points: np.ndarray, bits: int = 10) -> np.ndarray:
    """Indices that sort points (n, 3) along a Morton (Z-order) curve of their bounding box, as
    SuperSplat's writers order Gaussians so that neighbours share chunks and texture rows."""
    if len(points) == 0:
        return np.zeros(0, np.int64)
    lo, hi = points.min(0), points.max(0)
    span = np.where(hi - lo > 0, hi - lo, 1.0)
    q = np.clip(((points - lo) / span * ((1 << bits) - 1)).round(), 0, (1 << bits) - 1)
    q = q.astype(np.uint64)
    code = np.zeros(len(points), np.uint64)
    for b in range(bits):
        for axis in range(3):
            code |= ((q[:, axis] >> np.uint64(b)) & np.uint64(1)) << np.uint64(3 * b + axis)
    return np.argsort(code, kind="stable")


def splat_bytes(params: dict[str, torch.Tensor], normalization: dict | None, min_opacity=0.0):
    """(.splat bytes, number of Gaussians written)."""
    g = world_gaussians(params, normalization)
    keep = g["opacity"] >= min_opacity
    importance = np.exp(g["log_scales"].sum(1)) * g["opacity"]
    order = np.argsort(-importance[keep], kind="stable")
    sel = np.flatnonzero(keep)[order]
    out = np.zeros(len(sel), SPLAT_DTYPE)
    out["position"] = g["means"][sel]
    out["scale"] = np.exp(g["log_scales"][sel])
    rgba = np.concatenate([g["rgb"][sel], g["opacity"][sel, None]], 1)
    out["rgba"] = np.clip(rgba * 255, 0, 255).astype(np.uint8)
    out["rot"] = np.clip(g["quats"][sel] * 128 + 128, 0, 255).astype(np.uint8)
    return out.tobytes(), len(sel)


def read_splat(data: bytes) -> dict[str, np.ndarray]:
    """Columns of a .splat file (for tests and tools): position, scale, rgba, rot (as stored)."""
    if len(data) % SPLAT_DTYPE.itemsize:
        raise ValueError(".splat size is not a multiple of 32 bytes")
    arr = np.frombuffer(data, SPLAT_DTYPE)
    return {name: arr[name] for name in SPLAT_DTYPE.names}


def splat_point_cloud(
    params: dict[str, torch.Tensor], normalization: dict | None, n_points: int, min_opacity: float
):
    """(PLY bytes, stats): the centres of the most important Gaussians above min_opacity."""
    g = world_gaussians(params, normalization)
    keep = np.flatnonzero(g["opacity"] >= min_opacity)
    importance = np.exp(g["log_scales"][keep].sum(1)) * g["opacity"][keep]
    sel = keep[np.argsort(-importance, kind="stable")[:n_points]]
    pts = g["means"][sel]
    return point_cloud_ply(pts, g["rgb"][sel]), {"points": int(len(sel)), "bounds": bounds(pts)}
