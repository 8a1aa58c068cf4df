"""NeRF job intake: an archive of posed photos -> `dataset/cameras.json` + `dataset/images/`.

Understands Blender synthetic (`transforms_{train,val,test}.json`), instant-ngp / nerfstudio
(`transforms.json`) and COLMAP text models (`cameras.txt` + `images.txt`). Runs in the API process:
numpy and Pillow only, images are checked from their headers and container structure (no pixel
decode for PNG/JPEG).

Normalisation (stored in cameras.json as `normalization`, the same rule everywhere):

    p_normalised = (p_world - offset) * scale          (uniform scale, no rotation)
    c2w_normalised = [[R, (t - offset) * scale], [0, 0, 0, 1]]

* instant-ngp files with `scale`/`offset`: ngp maps p -> p*s + o into its unit cube [0,1]^3; our
  box is [-1,1]^3, so scale = 2*s and offset = (0.5 - o) / s (ngp defaults s=0.33, o=0.5 fill in
  whichever of the two is missing). `aabb_scale` a gives aabb = [-a,a]^3 as in ngp.
* everything else: offset = the point closest to all optical axes (where the cameras look), and
  scale = 1 / (median camera distance to it * tan(max half fov)), i.e. what a median camera sees
  at that distance fills the unit box. For the Blender scenes this gives ngp's own 0.33*2 within a
  few percent. Forward-facing captures (no common focus point) fall back to a point in front of
  the mean camera.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError
from pydantic import ValidationError

from api_schemas.nerf import NerfConfig
from core.scene_build import SceneFrame, write_scene
from core.scene_format import DISTORTION_KEYS, SceneError
from core.scene_format import UPLOAD_RIGID_TOL as RIGID_TOL
from core.scene_normalize import OPENCV_TO_OPENGL
from core.scene_normalize import check_rigid as core_check_rigid
from service.intake import IntakeError
from service.intake.archive import extract_archive, limits_from_settings

FORMATS = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp"}
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".PNG", ".JPG", ".JPEG", ".WEBP")
DEFAULT_MAX_DATASET_PIXELS = 100_000_000
# COLMAP model -> names of its parameters, in file order.
COLMAP_MODELS = {
    "SIMPLE_PINHOLE": ("f", "cx", "cy"),
    "PINHOLE": ("fx", "fy", "cx", "cy"),
    "SIMPLE_RADIAL": ("f", "cx", "cy", "k1"),
    "OPENCV": ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2"),
}


@dataclass
class RawFrame:
    """One posed photo as read from the upload, before image checks and normalisation."""

    image: Path
    name: str  # for messages: the path as written in the pose file
    c2w: np.ndarray  # 4x4, OpenGL axes, dataset world frame
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
    distortion: dict[str, float] = field(default_factory=dict)


@dataclass
class Parsed:
    frames: list[RawFrame]
    source_format: str
    ngp_scale: float | None = None
    ngp_offset: list[float] | None = None
    aabb_scale: float | None = None


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
        return core_check_rigid(m, what, RIGID_TOL)
    except SceneError as exc:
        raise IntakeError(422, str(exc)) from None


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):
        return False


def _resolve_image(base: Path, rel: str, root: Path, what: str) -> Path:
    """The image a pose file refers to; Blender writes paths without extension."""
    if not isinstance(rel, str) or not rel.strip():
        raise IntakeError(422, f"{what}: file_path is missing")
    rel = rel.strip().replace("\\", "/")
    cand = base / rel
    if not _inside(cand, root):
        raise IntakeError(422, f"{what}: file_path {rel!r} points outside the upload")
    options = [cand] if cand.suffix in IMAGE_EXTS else []
    options += [cand.with_name(cand.name + ext) for ext in IMAGE_EXTS]
    if cand not in options:
        options.insert(0, cand)
    for p in options:
        if p.is_file() and _inside(p, root):
            return p
    raise IntakeError(422, f"{what}: image {rel!r} is missing from the upload")


def _load_json(path: Path, root: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IntakeError(422, f"{path.relative_to(root)} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise IntakeError(422, f"{path.relative_to(root)} must hold a JSON object")
    return data


# --------------------------------------------------------------------------- parsers


def _parse_transforms(
    path: Path, root: Path, split: str | None, blender: bool
) -> tuple[list[RawFrame], dict]:
    """Blender and instant-ngp/nerfstudio files share one schema; ngp adds intrinsics keys."""
    data = _load_json(path, root)
    where = str(path.relative_to(root))
    frames = data.get("frames")
    if not isinstance(frames, list) or not frames:
        raise IntakeError(422, f"{where}: 'frames' must be a non-empty list")
    model = data.get("camera_model")
    if model is not None and str(model).upper() not in (
        "OPENCV",
        "PINHOLE",
        "SIMPLE_PINHOLE",
        "SIMPLE_RADIAL",
    ):
        raise IntakeError(
            422,
            f"{where}: camera_model {model!r} is not supported "
            "(supported: PINHOLE, SIMPLE_PINHOLE, SIMPLE_RADIAL, OPENCV)",
        )
    glob = _intrinsics_of(data, where)
    if blender and glob["fov_x"] is None and glob["fx"] is None:
        raise IntakeError(422, f"{where}: camera_angle_x is missing")
    out = []
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
        image = _resolve_image(path.parent, fr.get("file_path"), root, what)
        out.append(
            RawFrame(
                image=image,
                name=str(fr.get("file_path")),
                c2w=c2w,
                split=split,
                own_intrinsics=has_own,
                distortion=dist,
                **merged,
            )
        )
    extras = {
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
            k: _num(d[k], f"{what}: {k}") for k in DISTORTION_KEYS if d.get(k) is not None
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


def _colmap_lines(path: Path, root: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise IntakeError(422, f"{path.relative_to(root)} is not a text file") from None
    return text.splitlines()


def qvec_to_rotmat(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q
    return np.array(
        [
            [1 - 2 * y * y - 2 * z * z, 2 * x * y - 2 * w * z, 2 * x * z + 2 * w * y],
            [2 * x * y + 2 * w * z, 1 - 2 * x * x - 2 * z * z, 2 * y * z - 2 * w * x],
            [2 * x * z - 2 * w * y, 2 * y * z + 2 * w * x, 1 - 2 * x * x - 2 * y * y],
        ]
    )


def _parse_colmap(txt_dir: Path, root: Path) -> list[RawFrame]:
    cams_path, imgs_path = txt_dir / "cameras.txt", txt_dir / "images.txt"
    cams: dict[int, dict] = {}
    for ln, line in enumerate(_colmap_lines(cams_path, root), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        what = f"cameras.txt line {ln}"
        tok = line.split()
        if len(tok) < 4:
            raise IntakeError(422, f"{what}: expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS...")
        model = tok[1].upper()
        if model not in COLMAP_MODELS:
            raise IntakeError(
                422,
                f"{what}: camera model {tok[1]!r} is not supported "
                f"(supported: {', '.join(COLMAP_MODELS)})",
            )
        names = COLMAP_MODELS[model]
        if len(tok) != 4 + len(names):
            raise IntakeError(
                422,
                f"{what}: {model} needs {len(names)} parameters ({' '.join(names)}), "
                f"got {len(tok) - 4}",
            )
        vals = dict(zip(names, (_num(t, what) for t in tok[4:])))
        try:
            cam_id, w, h = int(tok[0]), int(tok[2]), int(tok[3])
        except ValueError:
            raise IntakeError(
                422, f"{what}: CAMERA_ID, WIDTH and HEIGHT must be integers"
            ) from None
        if w < 1 or h < 1:
            raise IntakeError(422, f"{what}: width and height must be positive")
        f = vals.pop("f", None)
        fx, fy = (f, f) if f is not None else (vals.pop("fx"), vals.pop("fy"))
        if fx <= 0 or fy <= 0:
            raise IntakeError(422, f"{what}: focal length must be positive")
        cams[cam_id] = {
            "fx": fx,
            "fy": fy,
            "cx": vals.pop("cx"),
            "cy": vals.pop("cy"),
            "w": w,
            "h": h,
            "distortion": {k: v for k, v in vals.items() if v != 0.0},
        }
    if not cams:
        raise IntakeError(422, "cameras.txt lists no cameras")

    lines = _colmap_lines(imgs_path, root)
    frames: list[RawFrame] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        what = f"images.txt line {i}"
        tok = line.split()
        if len(tok) < 10:
            raise IntakeError(422, f"{what}: expected IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME")
        i += 1  # the POINTS2D line that follows every image line (possibly empty)
        q = np.array([_num(t, what) for t in tok[1:5]])
        t = np.array([_num(v, what) for v in tok[5:8]])
        norm = np.linalg.norm(q)
        if abs(norm - 1) > 1e-2:
            raise IntakeError(422, f"{what}: quaternion is not a unit quaternion (norm {norm:.4g})")
        try:
            cam = cams[int(tok[8])]
        except (ValueError, KeyError):
            raise IntakeError(422, f"{what}: CAMERA_ID {tok[8]!r} is not in cameras.txt") from None
        # COLMAP stores world-to-camera in OpenCV axes; invert, then flip y and z to OpenGL.
        r = qvec_to_rotmat(q / norm)
        c2w_cv = np.eye(4)
        c2w_cv[:3, :3] = r.T
        c2w_cv[:3, 3] = -r.T @ t
        name = " ".join(tok[9:])
        image = _find_colmap_image(txt_dir, root, name, what)
        frames.append(
            RawFrame(
                image=image,
                name=name,
                c2w=c2w_cv @ OPENCV_TO_OPENGL,
                own_intrinsics=True,
                fx=cam["fx"],
                fy=cam["fy"],
                cx=cam["cx"],
                cy=cam["cy"],
                w=cam["w"],
                h=cam["h"],
                distortion=dict(cam["distortion"]),
            )
        )
    if not frames:
        raise IntakeError(422, "images.txt lists no images")
    frames.sort(
        key=lambda f: f.name
    )  # COLMAP's order is arbitrary; the 8th-image rule needs a stable one
    return frames


def _find_colmap_image(txt_dir: Path, root: Path, name: str, what: str) -> Path:
    rel = name.replace("\\", "/")
    d = txt_dir
    while True:
        for cand in (d / "images" / rel, d / rel):
            if cand.is_file():
                if not _inside(cand, root):
                    raise IntakeError(422, f"{what}: image name {name!r} points outside the upload")
                return cand
        if d == root or d.parent == d:
            break
        d = d.parent
    raise IntakeError(
        422,
        f"{what}: image {name!r} is missing from the upload (looked in images/ next to "
        "the model and in its parent folders)",
    )


def _visible(p: Path, root: Path) -> bool:
    rel = p.relative_to(root).parts
    return not any(part == "__MACOSX" or part.startswith("._") for part in rel)


def _shallowest(root: Path, name: str) -> Path | None:
    found = [p for p in root.rglob(name) if p.is_file() and _visible(p, root)]
    return min(found, key=lambda p: (len(p.relative_to(root).parts), str(p))) if found else None


def parse_dataset(root: Path) -> Parsed:
    """Find the pose files under `root` (an extracted upload) and read them into RawFrames."""
    root = root.resolve()
    train = _shallowest(root, "transforms_train.json")
    if train is not None:
        frames, extras = _parse_transforms(train, root, None, blender=True)
        test = train.parent / "transforms_test.json"
        val = train.parent / "transforms_val.json"
        if test.is_file():
            for f in frames:
                f.split = "train"
            frames += _parse_transforms(test, root, "test", blender=True)[0]
            if val.is_file():
                frames += _parse_transforms(val, root, "val", blender=True)[0]
        return Parsed(frames, "blender", extras["scale"], extras["offset"], extras["aabb_scale"])
    ngp = _shallowest(root, "transforms.json")
    if ngp is not None:
        frames, extras = _parse_transforms(ngp, root, None, blender=False)
        return Parsed(frames, "ngp", extras["scale"], extras["offset"], extras["aabb_scale"])
    images_txt = _shallowest(root, "images.txt")
    if images_txt is not None and (images_txt.parent / "cameras.txt").is_file():
        return Parsed(_parse_colmap(images_txt.parent, root), "colmap")
    if _shallowest(root, "images.bin") is not None:
        raise IntakeError(
            422,
            "binary COLMAP models are not supported; convert with "
            "`colmap model_converter --output_type TXT` and upload cameras.txt + images.txt",
        )
    raise IntakeError(
        422,
        "no camera poses found: expected transforms_train.json (Blender), transforms.json "
        "(instant-ngp / nerfstudio) or cameras.txt + images.txt (COLMAP)",
    )


# --------------------------------------------------------------------------- images and intrinsics


@dataclass
class ImageInfo:
    fmt: str
    w: int
    h: int
    alpha: bool


def _jpeg_complete(path: Path) -> bool:
    # A cut-off JPEG loses its end-of-image marker; some writers pad after it.
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - 65536))
        return b"\xff\xd9" in fh.read()


def inspect_image(path: Path, name: str, max_pixels: int) -> ImageInfo:
    """Header checks, then container integrity; pixels are decoded only for WebP (no cheap check)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                fmt, (w, h), mode, info = im.format, im.size, im.mode, dict(im.info)
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError):
        raise IntakeError(
            422, f"image {name!r} is unreadable (not a PNG, JPEG or WebP file)"
        ) from None
    if fmt not in FORMATS:
        raise IntakeError(422, f"image {name!r} is {fmt}; only PNG, JPEG and WebP are supported")
    if w < 1 or h < 1:
        raise IntakeError(422, f"image {name!r} has no pixels")
    if w * h > max_pixels:
        raise IntakeError(
            422,
            f"image {name!r} is {w}x{h} = {w * h} pixels, over the limit of {max_pixels} "
            "(MAX_IMAGE_PIXELS)",
        )
    if mode not in ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK", "YCbCr", "La", "RGBa"):
        raise IntakeError(
            422, f"image {name!r} has pixel mode {mode}; use 8-bit RGB(A) or grayscale"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                if fmt == "WEBP":
                    im.load()
                else:
                    im.verify()
    except Exception:
        raise IntakeError(422, f"image {name!r} is truncated or corrupt") from None
    if fmt == "JPEG" and not _jpeg_complete(path):
        raise IntakeError(422, f"image {name!r} is truncated (no JPEG end-of-image marker)")
    alpha = mode in ("LA", "PA", "RGBA", "La", "RGBa") or "transparency" in info
    return ImageInfo(fmt, w, h, alpha)


def resolve_intrinsics(f: RawFrame, img: ImageInfo) -> dict[str, float]:
    """fx, fy, cx, cy in pixels of the actual image (pose files may describe a rescaled copy)."""
    sx = sy = 1.0
    if f.w is not None and f.h is not None and (f.w, f.h) != (img.w, img.h):
        sx, sy = img.w / f.w, img.h / f.h
        if abs(sx / sy - 1) > 0.01:
            raise IntakeError(
                422,
                f"image {f.name!r} is {img.w}x{img.h} but its camera says {f.w}x{f.h} "
                "(not a uniform rescale)",
            )
    fx = f.fx * sx if f.fx is not None else None
    fy = f.fy * sy if f.fy is not None else None
    if fx is None and f.fov_x is not None:
        fx = 0.5 * img.w / math.tan(0.5 * f.fov_x)
    if fy is None and f.fov_y is not None:
        fy = 0.5 * img.h / math.tan(0.5 * f.fov_y)
    fx, fy = fx if fx is not None else fy, fy if fy is not None else fx
    if fx is None:
        raise IntakeError(422, f"image {f.name!r}: no focal length (need camera_angle_x or fl_x)")
    cx = f.cx * sx if f.cx is not None else img.w / 2
    cy = f.cy * sy if f.cy is not None else img.h / 2
    return {"fx": fx, "fy": fy, "cx": cx, "cy": cy}


# --------------------------------------------------------------------------- entry point


def _setting(settings, name: str, default):
    v = getattr(settings, name, None)
    return default if v is None else v


def build_dataset(root: Path, out_dir: Path, cfg: NerfConfig, settings) -> dict:
    """Parse and check the extracted upload at `root`; write the normal form to `out_dir`."""
    parsed = parse_dataset(root)
    frames = parsed.frames
    max_px = int(_setting(settings, "max_image_pixels", 40_000_000))
    infos = [inspect_image(f.image, f.name, max_px) for f in frames]
    total = sum(i.w * i.h for i in infos)
    cap = int(_setting(settings, "max_dataset_pixels", DEFAULT_MAX_DATASET_PIXELS))
    if total > cap:
        raise IntakeError(
            422,
            f"the images hold {total} pixels in all, over the limit of {cap} (MAX_DATASET_PIXELS)",
        )
    sizes = {(i.w, i.h) for f, i in zip(frames, infos) if not f.own_intrinsics}
    if len(sizes) > 1:
        raise IntakeError(
            422,
            "images have different sizes ("
            + ", ".join(f"{w}x{h}" for w, h in sorted(sizes))
            + ") but the cameras share one set of intrinsics; give per-frame intrinsics "
            "(fl_x, fl_y, cx, cy, w, h) or resize the images",
        )
    scene = [
        SceneFrame(
            image=f.image,
            c2w=f.c2w,
            **resolve_intrinsics(f, i),
            distortion=f.distortion,
            split=f.split,
            name=f.name,
        )
        for f, i in zip(frames, infos)
    ]
    try:
        return write_scene(
            out_dir,
            scene,
            source_format=parsed.source_format,
            ngp_scale=parsed.ngp_scale,
            ngp_offset=parsed.ngp_offset,
            aabb_scale=cfg.aabb_scale or parsed.aabb_scale,
            move_images=True,
        )
    except SceneError as exc:
        raise IntakeError(422, str(exc)) from None


def parse_config(config: dict[str, Any] | None) -> NerfConfig:
    try:
        return NerfConfig.model_validate(config or {})
    except ValidationError as exc:
        msg = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        )
        raise IntakeError(422, f"invalid nerf config: {msg}") from None


def validate_upload(
    src_path: Path, filename: str, config: dict[str, Any] | None, job_dir: Path, settings
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Validate an uploaded archive and write `job_dir/dataset/` in normal form.

    Returns (effective config, dataset summary). Raises IntakeError; on error nothing is left but
    the caller's upload (the extraction and a partial dataset are removed).
    """
    cfg = parse_config(config)
    job_dir = Path(job_dir).resolve()
    work = job_dir / "upload" / "extracted"
    partial = job_dir / "dataset.partial"
    final = job_dir / "dataset"
    for p in (work, partial):
        shutil.rmtree(p, ignore_errors=True)
    try:
        if Path(src_path).stat().st_size == 0:
            raise IntakeError(422, "the uploaded file is empty")
        extract_archive(Path(src_path), work, limits_from_settings(settings))
        partial.mkdir(parents=True)
        meta = build_dataset(work, partial, cfg, settings)
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(partial, ignore_errors=True)
    splits = [f["split"] for f in meta["frames"]]
    summary = {
        "filename": filename,
        "source_format": meta["source_format"],
        "n_train": splits.count("train"),
        "n_test": splits.count("test"),
        "n_val": splits.count("val"),
        "sizes": sorted({f"{f['w']}x{f['h']}" for f in meta["frames"]}),
        "has_alpha": meta["has_alpha"],
        "normalization": meta["normalization"],
    }
    return cfg.model_dump(mode="json"), summary
