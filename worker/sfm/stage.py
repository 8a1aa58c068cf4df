"""The preprocessing stage of an upload without poses: capture -> SfM -> normal-form dataset.

The API leaves the capture in `<job>/capture/` (`capture.json` plus `images/` or the video
file). This stage runs on the `preprocess` queue, works in `<job>/sfm/` (removed afterwards),
writes `<job>/dataset/` through core.scene_build exactly as a posed upload would be written
(plus SfM's sparse points as `points3D.txt`, which seed splats; splat jobs get undistorted
pinhole images, nerf jobs keep the lens distortion), and puts a nerfstudio-layout
`transforms.json` with the recovered cameras among the job's artifacts. The task then hands the
job to the train queue: one upload, one job.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from core.photos import COLMAP_FORMATS, save_copy
from core.scene_format import CAMERAS_FILE, MIN_TRAIN_VIEWS, SceneError
from worker.configs import job_config
from worker.sfm.colmap import SfmCancelled

__all__ = ["SfmCancelled", "StageError", "needs_preprocess", "publish", "run"]

log = logging.getLogger(__name__)
CAPTURE_DIR, MANIFEST, WORK_DIR = "capture", "capture.json", "sfm"
TRANSFORMS_ARTIFACT = "transforms.json"
VIDEO_END_PCT = 15  # share of the stage's progress spent decoding a video
COPIES_END_PCT = 10  # share spent writing JPEG copies of photos COLMAP cannot read
UNREGISTERED_LISTED = 20
EXIF_ORIENTATION = 0x0112  # 1: stored upright; 2-8: turned and/or mirrored
# A capture whose SfM took its worker process down this many times (COLMAP aborts on some
# inputs, the OOM killer on others) fails instead of being redelivered for ever.
# SfM runs of one capture that may end with their worker dead (killed, out of memory, COLMAP
# aborting) before the job fails instead of being delivered again; counted on the job's SFM
# lease (core/leases.py), so every host sees the same count.
MAX_ATTEMPTS = 3
# Kinds whose rasteriser takes pinhole cameras only: their images are undistorted by COLMAP
# (as the 3DGS reference does); nerf keeps the distortion and bends its rays instead.
PINHOLE_ONLY_KINDS = ("splat",)
CAPTURE_HINT = "SfM needs overlapping views of a textured, static scene; see docs/capture.md"


class StageError(Exception):
    """The capture cannot become a dataset; the message is for the uploader."""


@dataclass
class Capture:
    kind: str  # "images" | "video"
    image_dir: Path
    files: list[str]  # file names under image_dir
    names: list[str]  # as uploaded, for messages and transforms.json
    video: Path | None = None


def needs_preprocess(storage, job_id: str) -> bool:
    """The job holds a capture that SfM has not turned into a dataset yet."""
    return storage.exists(job_id, f"{CAPTURE_DIR}/{MANIFEST}") and not storage.exists(
        job_id, f"dataset/{CAMERAS_FILE}"
    )


def publish(storage, job_id: str) -> None:
    """Store what `run` made in the job's working copy (object storage; nothing to do with
    local storage): the recovered cameras' artifact, the dataset with its cameras file last (a
    dataset without it is one SfM has not finished, see needs_preprocess), then the capture is
    deleted as `run` deleted its copy."""
    from worker.scratch import is_local

    if is_local(storage):
        return
    work = storage.work_dir(job_id)
    storage.push(job_id, f"artifacts/{TRANSFORMS_ARTIFACT}")
    cameras = f"dataset/{CAMERAS_FILE}"
    for path in sorted(p for p in work.dataset.rglob("*") if p.is_file()):
        key = path.relative_to(work.root).as_posix()
        if key != cameras:
            storage.push(job_id, key)
    storage.push(job_id, cameras)
    for obj in storage.list(job_id, f"{CAPTURE_DIR}/"):
        storage.delete(job_id, obj.key)


def read_capture(paths) -> Capture:
    root = paths.root / CAPTURE_DIR
    m = json.loads((root / MANIFEST).read_text())
    if m["kind"] == "video":
        return Capture("video", paths.root / WORK_DIR / "frames", [], [], root / m["video"])
    return Capture("images", root / "images", list(m["files"]), list(m["names"]))


def _image_size(path: Path) -> tuple[int, int]:
    with Image.open(path) as im:
        return im.size


def colmap_readable(
    image_dir: Path, files: list[str], out_dir: Path, progress, cancelled
) -> tuple[Path, list[str]]:
    """The capture's photos as files COLMAP reads (core.photos.COLMAP_FORMATS), upright: a photo in
    another format (WebP, HEIF, AVIF), or one whose EXIF orientation says it is stored turned or
    mirrored (phones hold portrait shots so), is decoded into an upright JPEG or PNG copy under
    `out_dir`; the rest are linked there. COLMAP reads pixels as stored, so a turned photo would
    otherwise reconstruct (and train) on its side. Returns the folder and file names to give SfM
    (`image_dir`, `files` themselves when every photo is readable and upright). HEIF photos come
    out upright (core.photos)."""
    formats = []
    for f in files:
        with Image.open(image_dir / f) as im:
            turned = im.getexif().get(EXIF_ORIENTATION, 1) not in (1, None)
            formats.append(None if turned else im.format)
    todo = sum(fmt not in COLMAP_FORMATS for fmt in formats)
    if not todo:
        return image_dir, files
    out_dir.mkdir(parents=True, exist_ok=True)
    out, done = [], 0
    for f, fmt in zip(files, formats):
        if cancelled():
            raise SfmCancelled()
        src = image_dir / f
        if fmt in COLMAP_FORMATS:
            try:
                os.link(src, out_dir / f)
            except OSError:  # another file system, or links not allowed
                shutil.copyfile(src, out_dir / f)
            out.append(f)
            continue
        with Image.open(src) as im:
            fmt = im.format
            upright = ImageOps.exif_transpose(im)  # also drops the orientation tag
            out.append(save_copy(upright, fmt, out_dir / Path(f).stem).name)
        done += 1
        progress(done, todo)
    return out_dir, out


def opengl_c2w(world_from_cam: np.ndarray) -> np.ndarray:
    """A registered image's 3x4 world_from_cam (OpenCV camera axes) as a 4x4 OpenGL c2w."""
    from core.scene_normalize import OPENCV_TO_OPENGL

    c2w = np.eye(4)
    c2w[:3] = world_from_cam
    return c2w @ OPENCV_TO_OPENGL


def stand_upright(result) -> np.ndarray:
    """Rotates the SfM result's cameras and points (in place) into
    `core.scene_normalize.upright_rotation`'s frame, which render requests then use; returns
    the rotation (p_upright = R @ p_sfm)."""
    from core.scene_normalize import upright_rotation

    c2ws = np.array([opengl_c2w(r.world_from_cam) for r in result.registered])
    rot = upright_rotation(c2ws) if len(c2ws) else np.eye(3)
    for r in result.registered:
        r.world_from_cam = np.concatenate(
            [rot @ r.world_from_cam[:, :3], rot @ r.world_from_cam[:, 3:]], axis=1
        )
    result.points_xyz = np.asarray(result.points_xyz, dtype=np.float64) @ rot.T
    return rot


def nerfstudio_transforms(registered, names: dict[str, str], rot: np.ndarray) -> dict[str, Any]:
    """transforms.json as nerfstudio's ns-process-data writes it (OpenGL camera axes, OPENCV
    intrinsics), in the upright frame render requests use; `applied_transform` is the rotation
    from COLMAP's world frame to it (`rot`, as nerfstudio's orientation)."""
    from worker.sfm.camera import intrinsics

    def cam(r) -> dict[str, Any]:
        k = intrinsics(r.model, r.params_info, r.params)
        d = k["distortion"]
        return {
            "fl_x": k["fx"],
            "fl_y": k["fy"],
            "cx": k["cx"],
            "cy": k["cy"],
            "w": r.width,
            "h": r.height,
            **{key: d.get(key, 0.0) for key in ("k1", "k2", "p1", "p2")},
        }

    cams = [cam(r) for r in registered]
    shared = all(c == cams[0] for c in cams)
    frames = []
    for r, c in zip(registered, cams):
        c2w = opengl_c2w(r.world_from_cam)
        frame = {"file_path": f"images/{names[r.name]}", "transform_matrix": c2w.tolist()}
        if not shared:
            frame.update(c)
        frames.append(frame)
    out: dict[str, Any] = {"camera_model": "OPENCV"}
    if shared and cams:
        out.update(cams[0])
    out["frames"] = frames
    out["applied_transform"] = np.concatenate([rot, np.zeros((3, 1))], axis=1).tolist()
    return out


def choose_mapper(setting: str, n_images: int, global_min_images: int) -> str:
    if setting != "auto":
        return setting
    return "global" if n_images >= global_min_images else "incremental"


def sfm_options(settings, capture_kind: str, n_images: int, one_size: bool):
    """What SfM runs with on `n_images` photos (`capture_kind` "photos") or video frames."""
    from worker.sfm.camera import choose_model
    from worker.sfm.colmap import SfmOptions

    if capture_kind == "video":
        matcher = "sequential"
    elif n_images > settings.sfm_exhaustive_max_images and settings.sfm_vocab_tree_path:
        matcher = "vocab_tree"
    else:
        matcher = "exhaustive"
    model, distortion_after_mapping = choose_model(settings.sfm_camera_model)
    return SfmOptions(
        camera_model=model,
        distortion_after_mapping=distortion_after_mapping,
        matcher=matcher,
        threads=settings.sfm_threads,
        max_image_size=settings.sfm_max_image_size,
        single_camera=one_size,
        vocab_tree_path=settings.sfm_vocab_tree_path,
        mapper=choose_mapper(settings.sfm_mapper, n_images, settings.sfm_global_min_images),
    )


def run(job, paths, settings, progress, cancelled, deaths: int = 0) -> dict[str, Any]:
    """Run SfM on the job's capture and write its dataset; returns the dataset summary fields
    to merge into job.dataset. `deaths`: earlier runs on this capture that took their worker
    down. Raises StageError (readable) or SfmCancelled."""
    from core.scene_build import SceneFrame, write_scene
    from worker.sfm.camera import intrinsics
    from worker.sfm.colmap import run_sfm, undistort
    from worker.sfm.video import VideoError, extract_frames

    cap = read_capture(paths)
    if deaths >= MAX_ATTEMPTS:
        raise StageError(
            f"SfM ended its worker process {deaths} times on this capture (killed, or out of "
            "memory); try fewer or smaller photos, or a lower SFM_MAX_IMAGE_SIZE"
        )
    work = paths.root / WORK_DIR
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    partial = paths.root / "dataset.partial"
    shutil.rmtree(partial, ignore_errors=True)
    report = lambda pct: progress.report(int(pct), 100)  # noqa: E731
    report(0)
    # The cap stops the stage the way a cancel does (pycolmap's calls watch one token), so a
    # capture too big for this worker ends with a message instead of holding it for hours.
    limit = settings.sfm_max_seconds
    deadline = time.monotonic() + limit
    timed_out = lambda: bool(limit) and time.monotonic() > deadline  # noqa: E731
    user_cancelled = cancelled
    cancelled = lambda: user_cancelled() or timed_out()  # noqa: E731
    summary: dict[str, Any] = {}
    try:
        start_pct = 0.0
        if cap.kind == "video":
            try:
                frames = extract_frames(
                    cap.video,
                    cap.image_dir,
                    settings.sfm_num_frames_target,
                    settings.sfm_max_image_size,
                    progress=lambda k, n: report(VIDEO_END_PCT * k / n),
                    cancelled=cancelled,
                )
            except VideoError as exc:
                raise StageError(str(exc)) from None
            if cancelled():
                raise SfmCancelled()
            cap.files = cap.names = frames.names
            summary["n_video_frames"] = frames.n_video_frames
            start_pct = VIDEO_END_PCT
        else:
            image_dir, files = colmap_readable(
                cap.image_dir,
                cap.files,
                work / "photos",
                lambda k, n: report(COPIES_END_PCT * k / n),
                cancelled,
            )
            if files is not cap.files:
                summary["photos_converted"] = sum(a != b for a, b in zip(files, cap.files))
                cap.image_dir, cap.files = image_dir, files
                start_pct = COPIES_END_PCT
        sizes = {_image_size(cap.image_dir / f) for f in cap.files}
        opts = sfm_options(settings, cap.kind, len(cap.files), len(sizes) == 1)
        n = len(cap.files)
        result = run_sfm(
            cap.image_dir, cap.files, work, opts, report, cancelled, start_pct=start_pct
        )
        n_reg = len(result.registered)
        share = n_reg / max(1, n)
        summary.update(
            {
                "n_images": n,
                "n_registered": n_reg,
                "registered_share": round(share, 4),
                "camera_model": opts.camera_model,
                "matcher": opts.matcher,
                "mapper": opts.mapper,
                "sfm_s": round(sum(result.seconds.values()), 2),
                "mean_keypoints": round(result.mean_keypoints, 1),
            }
        )
        if result.distortion_fixed_while_mapping:
            summary["distortion_fixed_while_mapping"] = True
        min_share = settings.sfm_min_registered_share
        if share < min_share or n_reg < MIN_TRAIN_VIEWS + 1:
            raise StageError(
                f"SfM registered {n_reg} of {n} images ({share:.0%}); at least {min_share:.0%} "
                f"(SFM_MIN_REGISTERED_SHARE) and {MIN_TRAIN_VIEWS + 1} images must register. "
                f"{CAPTURE_HINT}"
            )
        image_dir = cap.image_dir
        kind = getattr(job.kind, "value", job.kind)
        if kind in PINHOLE_ONLY_KINDS and any(
            intrinsics(r.model, r.params_info, r.params)["distortion"] for r in result.registered
        ):
            t0 = time.perf_counter()
            result, image_dir = undistort(result, cap.image_dir, work / "undistorted")
            summary["undistorted"] = True
            summary["sfm_s"] = round(summary["sfm_s"] + time.perf_counter() - t0, 2)
        upright = stand_upright(result)
        display = dict(zip(cap.files, cap.names))
        scene = []
        for r in result.registered:
            k = intrinsics(r.model, r.params_info, r.params)
            scene.append(
                SceneFrame(
                    image=image_dir / r.name,
                    c2w=r.world_from_cam,
                    axes="opencv",
                    fx=k["fx"],
                    fy=k["fy"],
                    cx=k["cx"],
                    cy=k["cy"],
                    distortion=k["distortion"],
                    name=display[r.name],
                )
            )
        partial.mkdir()
        try:
            config = job_config(job)  # nerf's and splat's share the TrainingImages fields
            downscale = config.downscale
            meta = write_scene(
                partial,
                scene,
                source_format=f"sfm-{cap.kind}",
                # the training size, as for posed uploads (service/intake/scene/build.py)
                long_side=None if downscale else (config.long_side or settings.train_long_side),
                downscale=downscale,
                aabb_scale=config.aabb_scale,
                points_xyz=result.points_xyz,
                points_rgb=result.points_rgb,
                up=np.array([0.0, 0.0, 1.0]),  # stand_upright's frame
            )
        except SceneError as exc:
            raise StageError(str(exc)) from None
        paths.artifacts.mkdir(parents=True, exist_ok=True)
        transforms = nerfstudio_transforms(result.registered, display, upright)
        # The box the dataset was given (chosen from the cameras and points unless the job set
        # one), as instant-ngp's transforms.json carries it.
        transforms["aabb_scale"] = meta["aabb"][1][0]
        (paths.artifacts / TRANSFORMS_ARTIFACT).write_text(json.dumps(transforms, indent=1))
        if paths.dataset.exists():
            shutil.rmtree(paths.dataset)
        os.replace(partial, paths.dataset)
    except SfmCancelled:
        if timed_out() and not user_cancelled():
            on = f" on {len(cap.files)} images" if cap.files else ""
            raise StageError(
                f"SfM ran longer than {limit} s (SFM_MAX_SECONDS){on}; upload fewer or "
                "smaller photos (or lower SFM_MAX_IMAGE_SIZE / SFM_NUM_FRAMES_TARGET), or "
                "raise the limit"
            ) from None
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(paths.root / CAPTURE_DIR, ignore_errors=True)
    registered = {r.name for r in result.registered}
    splits = [f["split"] for f in meta["frames"]]
    summary.update(
        {
            "sfm": "done",
            "unregistered": [display[f] for f in cap.files if f not in registered][
                :UNREGISTERED_LISTED
            ],
            "n_points3d": int(meta.get("n_points3d", 0)),
            "n_train": splits.count("train"),
            "n_test": splits.count("test"),
            "n_val": splits.count("val"),
            "sizes": sorted({f"{f['w']}x{f['h']}" for f in meta["frames"]}),
            "has_alpha": meta["has_alpha"],
            "normalization": meta["normalization"],
            "aabb_scale": meta["aabb"][1][0],
            "source_format": meta["source_format"],
            "artifacts": [TRANSFORMS_ARTIFACT],
        }
    )
    return summary
