"""Pose files of an extracted upload -> RawFrames: Blender synthetic (`transforms_{train,val,
test}.json`), instant-ngp / nerfstudio (`transforms.json`, with nerfstudio's `mask_path` and
instant-ngp's `dynamic_mask_*.png` masks) and COLMAP models (`cameras` + `images` [+ `points3D`],
text or binary, e.g. `sparse/0/`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.photos import PHOTO_SUFFIXES
from core.scene_format import DISTORTION_KEYS, FISHEYE, FISHEYE_KEYS, PINHOLE, SceneError
from core.scene_normalize import check_rigid as _check_rigid
from service.intake import IntakeError
from service.intake.scene import colmap

# Suffixes tried, in this order, for a pose file's image path written without one (Blender's).
IMAGE_EXTS = PHOTO_SUFFIXES + tuple(s.upper() for s in PHOTO_SUFFIXES)
# transforms.json camera_model values (nerfstudio writes COLMAP's names).
TRANSFORMS_MODELS = ("OPENCV", "PINHOLE", "SIMPLE_PINHOLE", "SIMPLE_RADIAL", FISHEYE)
ALL_DISTORTION_KEYS = tuple(dict.fromkeys(DISTORTION_KEYS + FISHEYE_KEYS))
# A transforms.json of 10,000 frames with per-frame intrinsics is ~10 MB; json.loads needs ~10x
# a file's size, and a 200x compression ratio lets an 11 MB zip carry a 2 GiB one.
MAX_POSE_FILE_BYTES = 32 << 20


@dataclass
class RawFrame:
    """One posed photo as read from the upload, before image checks and normalisation."""

    image: Path
    name: str  # for messages: the path as written in the pose file
    c2w: np.ndarray  # 4x4, dataset world frame, axes per `axes`
    axes: str = "opengl"
    split: str | None = None  # None: decided by the every-8th rule
    fx: float | None = None
    fy: float | None = None
    cx: float | None = None
    cy: float | None = None
    fov_x: float | None = None  # radians
    fov_y: float | None = None
    w: int | None = None  # size the intrinsics refer to, if the pose file says
    h: int | None = None
    own_intrinsics: bool = False  # per-frame intrinsics: mixed image sizes are then fine
    camera_model: str = PINHOLE
    distortion: dict[str, float] = field(default_factory=dict)
    mask: Path | None = None
    mask_keeps_nonzero: bool = True


@dataclass
class Parsed:
    frames: list[RawFrame]
    source_format: str
    ngp_scale: float | None = None
    ngp_offset: list[float] | None = None
    aabb_scale: float | None = None
    points_xyz: np.ndarray | None = None
    points_rgb: np.ndarray | None = None
    # Frames of the pose file whose photo is not in the upload (instant-ngp transforms.json only:
    # a capture's folder often lists frames culled after its poses were solved).
    missing: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- helpers


def _num(value: Any, what: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise IntakeError(422, f"{what} is not a number: {value!r}") from None
    if not math.isfinite(x):
        raise IntakeError(422, f"{what} is not finite ({value!r})")
    return x


def _opt_num(d: dict, key: str, what: str) -> float | None:
    return None if d.get(key) is None else _num(d[key], f"{what}: {key}")


def check_rigid(m: Any, what: str) -> np.ndarray:
    try:
        return _check_rigid(m, what)
    except SceneError as exc:
        raise IntakeError(422, str(exc)) from None


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):
        return False


def _resolve_file(base: Path, rel: Any, root: Path, what: str, key: str = "file_path") -> Path:
    """The image (or mask) a pose file refers to; Blender writes paths without extension."""
    if not isinstance(rel, str) or not rel.strip():
        raise IntakeError(422, f"{what}: {key} is missing")
    rel = rel.strip().replace("\\", "/")
    cand = base / rel
    if not _inside(cand, root):
        raise IntakeError(422, f"{what}: {key} {rel!r} points outside the upload")
    options = [cand] if cand.suffix in IMAGE_EXTS else []
    options += [cand.with_name(cand.name + ext) for ext in IMAGE_EXTS]
    if cand not in options:
        options.insert(0, cand)
    for p in options:
        if p.is_file() and _inside(p, root):
            return p
    raise IntakeError(
        422, f"{what}: {'image' if key == 'file_path' else key} {rel!r} is missing from the upload"
    )


def _load_json(path: Path, root: Path) -> dict:
    size = path.stat().st_size
    if size > MAX_POSE_FILE_BYTES:
        raise IntakeError(
            413,
            f"{path.relative_to(root)} is {size} bytes, over the {MAX_POSE_FILE_BYTES}-byte "
            "limit of a pose file",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IntakeError(422, f"{path.relative_to(root)} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise IntakeError(422, f"{path.relative_to(root)} must hold a JSON object")
    return data


def _visible(p: Path, root: Path) -> bool:
    rel = p.relative_to(root).parts
    return not any(part == "__MACOSX" or part.startswith("._") for part in rel)


def shallowest(root: Path, name: str) -> Path | None:
    found = [p for p in root.rglob(name) if p.is_file() and _visible(p, root)]
    return min(found, key=lambda p: (len(p.relative_to(root).parts), str(p))) if found else None


# --------------------------------------------------------------------------- transforms.json


def _camera_model(d: dict, where: str) -> str:
    model = d.get("camera_model")
    if model is None:
        return PINHOLE
    if str(model).upper() not in TRANSFORMS_MODELS:
        raise IntakeError(
            422,
            f"{where}: camera_model {model!r} is not supported "
            f"(supported: {', '.join(TRANSFORMS_MODELS)})",
        )
    return FISHEYE if str(model).upper() == FISHEYE else PINHOLE


def _check_distortion(model: str, dist: dict[str, float], what: str) -> None:
    allowed = FISHEYE_KEYS if model == FISHEYE else DISTORTION_KEYS
    extra = sorted(k for k, v in dist.items() if v and k not in allowed)
    if extra:
        raise IntakeError(
            422,
            f"{what}: {', '.join(extra)} do not belong to camera model "
            f"{'OPENCV_FISHEYE' if model == FISHEYE else 'OPENCV'} "
            f"(its coefficients: {', '.join(allowed)})",
        )


def _intrinsics_of(d: dict, what: str) -> dict:
    r = {
        "fx": _opt_num(d, "fl_x", what),
        "fy": _opt_num(d, "fl_y", what),
        "cx": _opt_num(d, "cx", what),
        "cy": _opt_num(d, "cy", what),
        "fov_x": _opt_num(d, "camera_angle_x", what),
        "fov_y": _opt_num(d, "camera_angle_y", what),
        "w": None,
        "h": None,
        "distortion": {
            k: _num(d[k], f"{what}: {k}") for k in ALL_DISTORTION_KEYS if d.get(k) is not None
        },
    }
    for key in ("w", "h"):
        if d.get(key) is not None:
            v = _num(d[key], f"{what}: {key}")
            if v < 1 or v != int(v):
                raise IntakeError(422, f"{what}: {key} must be a positive integer")
            r[key] = int(v)
    for key in ("fov_x", "fov_y"):
        if r[key] is not None and not 0 < r[key] < math.pi:
            raise IntakeError(
                422, f"{what}: camera_angle_{key[-1]} must be between 0 and pi radians"
            )
    for key in ("fx", "fy"):
        if r[key] is not None and r[key] <= 0:
            raise IntakeError(422, f"{what}: fl_{key[-1]} must be positive")
    r["distortion"] = {k: v for k, v in r["distortion"].items() if v != 0.0}
    return r


def _ngp_dynamic_mask(image: Path) -> Path | None:
    """instant-ngp's per-image mask: `dynamic_mask_<stem>.png` beside the image; nonzero pixels
    are dynamic and never train."""
    p = image.with_name(f"dynamic_mask_{image.stem}.png")
    return p if p.is_file() else None


def _check_frame_count(n: int, max_frames: int, where: str) -> None:
    if n > max_frames:
        raise IntakeError(
            413,
            f"{where}: {n} frames, over the limit of {max_frames} (MAX_ARCHIVE_ENTRIES: every "
            "frame needs its own photo)",
        )


def _parse_transforms(
    path: Path, root: Path, split: str | None, blender: bool, max_frames: int
) -> tuple[list[RawFrame], dict]:
    """Blender and instant-ngp/nerfstudio files share one schema; ngp adds intrinsics keys."""
    data = _load_json(path, root)
    where = str(path.relative_to(root))
    frames = data.get("frames")
    if not isinstance(frames, list) or not frames:
        raise IntakeError(422, f"{where}: 'frames' must be a non-empty list")
    _check_frame_count(len(frames), max_frames, where)
    model = _camera_model(data, where)
    glob = _intrinsics_of(data, where)
    if blender and glob["fov_x"] is None and glob["fx"] is None:
        raise IntakeError(422, f"{where}: camera_angle_x is missing")
    out, missing = [], []
    first_missing: IntakeError | None = None
    for i, fr in enumerate(frames):
        what = f"{where} frame {i}"
        if not isinstance(fr, dict):
            raise IntakeError(422, f"{what} is not an object")
        if "transform_matrix" not in fr:
            raise IntakeError(422, f"{what}: transform_matrix is missing")
        c2w = check_rigid(fr["transform_matrix"], what)
        own = _intrinsics_of(fr, what)
        has_own = any(v is not None for k, v in own.items() if k != "distortion") or bool(
            own["distortion"]
        )
        merged = {k: (own[k] if own[k] is not None else glob[k]) for k in glob if k != "distortion"}
        dist = {**glob["distortion"], **own["distortion"]}
        _check_distortion(model, dist, what)
        try:
            image = _resolve_file(path.parent, fr.get("file_path"), root, what)
        except IntakeError as exc:
            # Blender datasets are complete by construction; an instant-ngp capture is a folder
            # a user pruned after solving its poses, which instant-ngp itself trains as it is.
            if blender or "is missing from the upload" not in exc.detail:
                raise
            missing.append(str(fr["file_path"]))
            first_missing = first_missing or exc
            continue
        mask, keeps_nonzero = None, True
        if fr.get("mask_path") is not None:
            mask = _resolve_file(path.parent, fr["mask_path"], root, what, "mask_path")
        elif not blender:
            mask, keeps_nonzero = _ngp_dynamic_mask(image), False
        out.append(
            RawFrame(
                image=image,
                name=str(fr.get("file_path")),
                c2w=c2w,
                split=split,
                own_intrinsics=has_own,
                camera_model=model,
                distortion=dist,
                mask=mask,
                mask_keeps_nonzero=keeps_nonzero,
                **merged,
            )
        )
    if not out and first_missing is not None:
        raise first_missing
    extras = {
        "missing": missing,
        "scale": _opt_num(data, "scale", where),
        "aabb_scale": _opt_num(data, "aabb_scale", where),
    }
    off = data.get("offset")
    if off is not None:
        if not (isinstance(off, list) and len(off) == 3):
            raise IntakeError(422, f"{where}: offset must be a list of 3 numbers")
        off = [_num(v, f"{where}: offset") for v in off]
    extras["offset"] = off
    if extras["scale"] is not None and extras["scale"] <= 0:
        raise IntakeError(422, f"{where}: scale must be positive")
    if extras["aabb_scale"] is not None and not 1 <= extras["aabb_scale"] <= 128:
        raise IntakeError(422, f"{where}: aabb_scale must be between 1 and 128")
    return out, extras


# --------------------------------------------------------------------------- COLMAP


def _find_colmap_image(model_dir: Path, root: Path, name: str, what: str) -> Path:
    rel = name.replace("\\", "/")
    # Refused from the name alone, before any lookup: whether a server path exists must not
    # change the answer.
    if rel.startswith("/") or ".." in rel.split("/") or (len(rel) > 1 and rel[1] == ":"):
        raise IntakeError(422, f"{what}: image name {name!r} points outside the upload")
    d = model_dir
    while True:
        for cand in (d / "images" / rel, d / rel):
            if _inside(cand, root) and cand.is_file():
                return cand
        if d == root or d.parent == d:
            break
        d = d.parent
    raise IntakeError(
        422,
        f"{what}: image {name!r} is missing from the upload (looked in images/ next to "
        "the model and in its parent folders)",
    )


def _colmap_model_dir(root: Path) -> Path | None:
    """The shallowest folder holding a COLMAP model (cameras + images, .txt or .bin)."""
    dirs = []
    for ext in ("txt", "bin"):
        p = shallowest(root, f"images.{ext}")
        if p is not None and (p.parent / f"cameras.{ext}").is_file():
            dirs.append(p.parent)
    return min(dirs, key=lambda p: (len(p.relative_to(root).parts), str(p))) if dirs else None


def _parse_colmap(model_dir: Path, root: Path, work_dir: Path, max_frames: int) -> Parsed:
    where = str(model_dir.relative_to(root)) or "the upload's top folder"
    model = colmap.read_model(model_dir, work_dir, where)
    _check_frame_count(len(model.images), max_frames, where)
    for cid, cam in model.cameras.items():
        if cam["model"] not in colmap.MODELS:
            raise IntakeError(
                422,
                f"{where}: camera {cid}: camera model {cam['model']!r} is not supported "
                f"(supported: {', '.join(colmap.MODELS)})",
            )
        if cam["fx"] <= 0 or cam["fy"] <= 0:
            raise IntakeError(422, f"{where}: camera {cid}: focal length must be positive")
        if not all(math.isfinite(v) for v in (cam["fx"], cam["fy"], cam["cx"], cam["cy"])):
            raise IntakeError(422, f"{where}: camera {cid}: parameters are not finite")
    frames = []
    for img in model.images:
        what = f"{where}: image {img['name']!r}"
        w2c = np.eye(4)
        w2c[:3] = np.asarray(img["cam_from_world"], dtype=np.float64)
        if not np.isfinite(w2c).all():
            raise IntakeError(422, f"{what}: pose is not finite")
        cam = model.cameras[img["camera_id"]]
        frames.append(
            RawFrame(
                image=_find_colmap_image(model_dir, root, img["name"], what),
                name=img["name"],
                c2w=np.linalg.inv(w2c),  # COLMAP stores world-to-camera, OpenCV axes
                axes="opencv",
                own_intrinsics=True,
                fx=cam["fx"],
                fy=cam["fy"],
                cx=cam["cx"],
                cy=cam["cy"],
                w=cam["w"],
                h=cam["h"],
                camera_model=FISHEYE if cam["fisheye"] else PINHOLE,
                distortion={k: v for k, v in cam["distortion"].items() if v != 0.0},
            )
        )
    if not frames:
        raise IntakeError(422, f"{where}: the COLMAP model has no posed images")
    frames.sort(key=lambda f: f.name)  # COLMAP's order is arbitrary; the 8th-image rule needs one
    return Parsed(frames, "colmap", points_xyz=model.points_xyz, points_rgb=model.points_rgb)


# --------------------------------------------------------------------------- entry point


def parse_dataset(root: Path, work_dir: Path, max_frames: int = 10_000) -> Parsed:
    """Find the pose files under `root` (an extracted upload) and read them into RawFrames;
    `work_dir` is scratch space outside `root` (removed by the caller). More than `max_frames`
    frames (all splits together) is a 413."""
    root = root.resolve()
    train = shallowest(root, "transforms_train.json")
    if train is not None:
        frames, extras = _parse_transforms(train, root, None, True, max_frames)
        test = train.parent / "transforms_test.json"
        val = train.parent / "transforms_val.json"
        if test.is_file():
            for f in frames:
                f.split = "train"
            frames += _parse_transforms(test, root, "test", True, max_frames - len(frames))[0]
            if val.is_file():
                frames += _parse_transforms(val, root, "val", True, max_frames - len(frames))[0]
        return Parsed(frames, "blender", extras["scale"], extras["offset"], extras["aabb_scale"])
    ngp = shallowest(root, "transforms.json")
    if ngp is not None:
        frames, extras = _parse_transforms(ngp, root, None, False, max_frames)
        return Parsed(
            frames,
            "ngp",
            extras["scale"],
            extras["offset"],
            extras["aabb_scale"],
            missing=extras["missing"],
        )
    model_dir = _colmap_model_dir(root)
    if model_dir is not None:
        return _parse_colmap(model_dir, root, work_dir, max_frames)
    raise IntakeError(
        422,
        "no camera poses found: expected transforms_train.json (Blender), transforms.json "
        "(instant-ngp / nerfstudio) or a COLMAP model (cameras + images, .txt or .bin, e.g. "
        "sparse/0/)",
    )
