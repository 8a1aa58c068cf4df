"""Sparse points for a posed upload: SIFT features and matches triangulated with the known cameras.

A posed upload (instant-ngp / nerfstudio transforms.json, Blender) carries no sparse points, so a
splat job would start from random points in the scene box. With the cameras known, COLMAP's point
triangulator needs only features and verified matches: no pose estimation, no bundle adjustment
of the cameras. The dataset's cameras are in the normalised frame with OpenGL axes; COLMAP takes
cam_from_world with OpenCV axes. Points come back in the normalised frame.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.scene_format import FISHEYE, FISHEYE_KEYS
from worker.sfm.colmap import SEED, SfmCancelled, _threads, _Watcher

# Fewer points than this seed no better than random ones; the caller falls back.
MIN_POINTS = 50
GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])


class TriangulationFailed(Exception):
    """Why no seed points came out (the caller logs it and starts from random points)."""


@dataclass
class Triangulated:
    xyz: np.ndarray  # (N, 3) normalised scene frame
    rgb: np.ndarray  # (N, 3) uint8
    n_images: int
    seconds: dict[str, float]


def _camera(frame: dict[str, Any]):
    """The frame's intrinsics as a COLMAP camera (pinhole, FULL_OPENCV or OPENCV_FISHEYE)."""
    import pycolmap

    dist = {k: float(v) for k, v in (frame.get("distortion") or {}).items() if v}
    f = [float(frame[k]) for k in ("fx", "fy", "cx", "cy")]
    if frame.get("camera_model") == FISHEYE:
        model, params = "OPENCV_FISHEYE", f + [dist.get(k, 0.0) for k in FISHEYE_KEYS]
    elif dist:
        order = ("k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6")
        model, params = "FULL_OPENCV", f + [dist.get(k, 0.0) for k in order]
    else:
        model, params = "PINHOLE", f
    return pycolmap.Camera(
        model=model, width=int(frame["w"]), height=int(frame["h"]), params=params
    )


def _cam_from_world(c2w_gl: np.ndarray) -> np.ndarray:
    c2w = np.asarray(c2w_gl, dtype=np.float64) @ GL_TO_CV
    return np.linalg.inv(c2w)[:3, :4]


def triangulate(
    dataset_dir: Path,
    meta: dict[str, Any],
    work_dir: Path,
    max_seconds: float,
    threads: int = 0,
    max_image_size: int = 1600,
    exhaustive_max_images: int = 300,
) -> Triangulated:
    """Triangulate SIFT matches between the training frames of `dataset_dir` with their cameras.

    Args:
        dataset_dir: the dataset's normal form (cameras.json + images).
        meta: its cameras.json.
        work_dir: COLMAP's database and model go here.
        max_seconds: the whole run is cancelled past this.
        threads: 0 = all cores.
        max_image_size: long side features are extracted at.
        exhaustive_max_images: up to this many frames match every pair, more match in sequence.

    Returns:
        Triangulated points (normalised frame) and colours.

    Raises:
        TriangulationFailed: too few frames or points, or past the time cap.
    """
    try:
        return _triangulate(
            dataset_dir, meta, work_dir, max_seconds, threads, max_image_size, exhaustive_max_images
        )
    except (InterruptedError, SfmCancelled):
        raise TriangulationFailed(f"ran past its {max_seconds:g} s cap") from None


def _triangulate(dataset_dir, meta, work_dir, max_seconds, threads, max_image_size, exh_max):
    import pycolmap

    frames = [f for f in meta["frames"] if f.get("split", "train") == "train"]
    if len(frames) < 2:
        raise TriangulationFailed(f"{len(frames)} training frame(s); triangulation needs two")
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    db = work_dir / "database.db"
    db.unlink(missing_ok=True)
    deadline = time.monotonic() + max_seconds
    seconds: dict[str, float] = {}
    by_name = {f["file"]: f for f in frames}
    device = pycolmap.Device.cpu
    with _Watcher(lambda: time.monotonic() > deadline) as watch:
        t0 = time.perf_counter()
        eo = pycolmap.FeatureExtractionOptions()
        eo.num_threads = _threads(threads)
        eo.max_image_size = max_image_size
        pycolmap.extract_features(
            db,
            dataset_dir,
            image_names=list(by_name),
            camera_mode=pycolmap.CameraMode.PER_IMAGE,
            extraction_options=eo,
            device=device,
            cancellation_token=watch.token,
        )
        watch.check()
        # the known intrinsics, so that two-view verification and triangulation use them
        with pycolmap.Database.open(db) as database:
            images = database.read_all_images()
            for img in images:
                cam = _camera(by_name[img.name])
                cam.camera_id = img.camera_id
                cam.has_prior_focal_length = True
                database.update_camera(cam)
        seconds["extract"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        mo = pycolmap.FeatureMatchingOptions()
        mo.num_threads = _threads(threads)
        vo = pycolmap.TwoViewGeometryOptions()
        vo.ransac.random_seed = SEED
        common = dict(
            matching_options=mo,
            verification_options=vo,
            device=device,
            cancellation_token=watch.token,
        )
        if len(images) <= exh_max:
            pycolmap.match_exhaustive(db, **common)
        else:
            pycolmap.match_sequential(db, **common)
        watch.check()
        seconds["match"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        rec = pycolmap.Reconstruction()
        for img in images:
            cam = _camera(by_name[img.name])
            cam.camera_id = img.camera_id
            rec.add_camera_with_trivial_rig(cam)
            pose = pycolmap.Rigid3d(_cam_from_world(by_name[img.name]["c2w"]))
            rec.add_image_with_trivial_frame(
                pycolmap.Image(name=img.name, camera_id=img.camera_id, image_id=img.image_id), pose
            )
        po = pycolmap.IncrementalPipelineOptions()
        po.num_threads = _threads(threads)
        po.random_seed = SEED
        rec = pycolmap.triangulate_points(
            rec,
            db,
            dataset_dir,
            work_dir / "model",
            options=po,
            refine_intrinsics=False,
            cancellation_token=watch.token,
        )
        watch.check()
        seconds["triangulate"] = time.perf_counter() - t0

    pts = list(rec.points3D.values())
    if len(pts) < MIN_POINTS:
        raise TriangulationFailed(f"{len(pts)} points triangulated (fewer than {MIN_POINTS})")
    xyz = np.array([p.xyz for p in pts], dtype=np.float64)
    rgb = np.array([p.color for p in pts], dtype=np.uint8)
    return Triangulated(xyz=xyz, rgb=rgb, n_images=len(images), seconds=seconds)


def to_world(xyz: np.ndarray, normalization: dict[str, Any]) -> np.ndarray:
    """Normalised scene frame -> the upload's world frame (points3D.txt's frame)."""
    return xyz / float(normalization["scale"]) + np.asarray(normalization["offset"], np.float64)


def write_points3d(path: Path, xyz_world: np.ndarray, rgb: np.ndarray) -> None:
    """COLMAP points3D.txt (no tracks), as the intake keeps an upload's sparse points."""
    lines = ["# 3D point list: POINT3D_ID X Y Z R G B ERROR (triangulated with known poses)"]
    for i, (p, c) in enumerate(zip(xyz_world, rgb), start=1):
        lines.append(f"{i} {p[0]:.7g} {p[1]:.7g} {p[2]:.7g} {int(c[0])} {int(c[1])} {int(c[2])} 0")
    Path(path).write_text("\n".join(lines) + "\n")
