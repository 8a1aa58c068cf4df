"""What every export shares: the error a client can act on, the way back to world units, and the
coloured point-cloud PLY."""

from __future__ import annotations

import numpy as np


class ExportError(Exception):
    """The export cannot be made from this job with these options; the message says why."""


def to_world(points: np.ndarray, normalization: dict | None) -> np.ndarray:
    """Normalised-frame points (N, 3) -> the dataset's world frame: p / scale + offset."""
    if normalization is None:
        return np.asarray(points, np.float64)
    s = float(normalization["scale"])
    return np.asarray(points, np.float64) / s + np.asarray(normalization["offset"], np.float64)


def point_cloud_ply(points: np.ndarray, rgb: np.ndarray) -> bytes:
    """Binary PLY of points (N, 3) with colours (N, 3) in [0, 1] (x y z red green blue)."""
    import trimesh

    rgba = np.concatenate(
        [np.clip(np.round(rgb * 255), 0, 255), np.full((len(rgb), 1), 255)], 1
    ).astype(np.uint8)
    data = trimesh.PointCloud(np.asarray(points, np.float64), colors=rgba).export(file_type="ply")
    return data if isinstance(data, bytes) else data.encode()


def bounds(points: np.ndarray) -> list[list[float]] | None:
    if len(points) == 0:
        return None
    return [np.min(points, 0).tolist(), np.max(points, 0).tolist()]
