"""Write a scene dataset in normal form: `out_dir/cameras.json`, `images/`, `masks/` and, when the
capture has sparse points, `points3D.txt` (docs/architecture.md has the schema).

Every source of posed photos goes through `write_scene`: the upload parsers of service/intake and
the worker's structure-from-motion stage. It assigns the splits, downsizes to the training
resolution (intrinsics scaled to match), normalises the poses (core.scene_normalize) and writes
the files. numpy and Pillow only.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image

from core.photos import FORMAT_NAMES, JPEG_QUALITY, LOSSY, has_alpha
from core.scene_format import (
    CAMERAS_FILE,
    DISTORTION_KEYS,
    FISHEYE,
    FISHEYE_KEYS,
    FORMAT_VERSION,
    IMAGES_DIR,
    MASKS_DIR,
    MIN_TRAIN_VIEWS,
    PINHOLE,
    TEST_EVERY,
    SceneError,
)
from core.scene_normalize import (
    OPENCV_TO_OPENGL,
    choose_aabb_scale,
    fit_normalization,
    ngp_normalization,
    normalize_c2w,
    world_up,
)

# Formats stored as uploaded when no resize is needed; others (HEIF, AVIF) get a JPEG or PNG copy
# that browsers and every reader of the dataset can open.
SUFFIX = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp"}


@dataclass
class SceneFrame:
    """One posed photo on its way into the normal form.

    `image`: a photo file (core.photos.FORMATS) or a uint8 array (H, W), (H, W, 3) or (H, W, 4).
    `c2w`: 4x4 (or 3x4) camera-to-world in the dataset's world frame; `axes` "opengl" (x right,
    y up, looking down -z: Blender, instant-ngp, nerfstudio) or "opencv" (y down, looking down +z:
    COLMAP's inverted cam_from_world).
    `fx, fy, cx, cy`: pixels of `image` as given (pixel centres at integer + 0.5).
    `distortion`: DISTORTION_KEYS for PINHOLE, FISHEYE_KEYS for OPENCV_FISHEYE; missing keys are 0.
    `mask`: same size as the image; with `mask_keeps_nonzero` nonzero pixels train (nerfstudio),
    without it nonzero pixels never train (instant-ngp's dynamic_mask_*).
    `split`: "train" | "test" | "val", or None for the every-TEST_EVERY-th rule.
    """

    image: Path | np.ndarray
    c2w: np.ndarray
    fx: float
    fy: float
    cx: float
    cy: float
    axes: Literal["opengl", "opencv"] = "opengl"
    camera_model: str = PINHOLE
    distortion: dict[str, float] = field(default_factory=dict)
    split: str | None = None
    name: str = ""
    mask: Path | np.ndarray | None = None
    mask_keeps_nonzero: bool = True


def target_size(
    w: int, h: int, long_side: int | None = None, downscale: float | None = None
) -> tuple[int, int]:
    """Training size of a w x h photo: `downscale` divides both sides (nerfstudio's images_N),
    else the long side is brought down to `long_side`; never upscaled."""
    s = 1.0
    if downscale:
        s = 1.0 / downscale
    elif long_side and max(w, h) > long_side:
        s = long_side / max(w, h)
    if s >= 1.0:
        return w, h
    return max(1, round(w * s)), max(1, round(h * s))


def assign_splits(frames: list[SceneFrame]) -> None:
    """Every TEST_EVERY-th frame without a split (in order) is test, the rest train; SceneError
    when fewer than MIN_TRAIN_VIEWS train or no test frames remain."""
    unsplit = [f for f in frames if f.split is None]
    for k, f in enumerate(unsplit):
        f.split = "test" if k % TEST_EVERY == 0 else "train"
    n_train = sum(f.split == "train" for f in frames)
    n_test = sum(f.split == "test" for f in frames)
    if n_train < MIN_TRAIN_VIEWS or n_test < 1:
        raise SceneError(
            f"too few images: {n_train} for training and {n_test} for testing; at least "
            f"{MIN_TRAIN_VIEWS} training images and 1 test image are needed"
        )


@dataclass
class _Source:
    w: int
    h: int
    fmt: str | None  # PIL format of a file, None for arrays
    alpha: bool


def _open(path: Path) -> Image.Image:
    with warnings.catch_warnings():
        # Callers cap pixels per image (MAX_IMAGE_PIXELS) before this; Pillow's own guess is moot.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(path)


def _as_array(a: np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != np.uint8 or a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] not in (3, 4)):
        raise SceneError(f"{what}: expected a uint8 array (H, W), (H, W, 3) or (H, W, 4)")
    return a


def _probe(image: Path | np.ndarray, what: str) -> _Source:
    if isinstance(image, np.ndarray):
        a = _as_array(image, what)
        return _Source(a.shape[1], a.shape[0], None, a.ndim == 3 and a.shape[2] == 4)
    try:
        with _open(image) as im:
            alpha = has_alpha(im.mode, im.info)
            return _Source(im.size[0], im.size[1], im.format, alpha)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise SceneError(f"image {what!r} is unreadable") from None


def _decode(image: Path | np.ndarray, src: _Source, size: tuple[int, int], what: str):
    try:
        if isinstance(image, np.ndarray):
            im = Image.fromarray(_as_array(image, what))
        else:
            im = _open(image)
            if src.fmt == "JPEG":
                im.draft("RGB", size)  # DCT-domain downscale: decodes a 1/2..1/8 size directly
        im = im.convert("RGBA" if src.alpha else "RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise SceneError(f"image {what!r} is truncated or corrupt") from None
    if im.size != size:
        im = im.resize(size, Image.Resampling.LANCZOS)
    return im


# A photo's background counts as one flat colour (an object on black or white: empty space
# around it, not a room) when this share of its border pixels lies within FLAT_TOL levels of
# their median colour; the photos' background is flat when FLAT_PHOTOS of FLAT_SAMPLES are.
FLAT_BORDER_SHARE, FLAT_TOL, FLAT_SAMPLES, FLAT_PHOTOS = 0.6, 8, 8, 0.75


def flat_background(frames: list[SceneFrame], srcs: list[_Source]) -> bool:
    """Whether the photos show their subject on one flat colour (read from up to FLAT_SAMPLES
    photos, decoded at 64 pixels on the long side)."""
    picks = sorted(set(np.linspace(0, len(frames) - 1, min(len(frames), FLAT_SAMPLES)).round()))
    flat = 0
    for i in (int(k) for k in picks):
        f, src = frames[i], srcs[i]
        im = _decode(f.image, src, target_size(src.w, src.h, 64, None), f.name)
        a = np.asarray(im.convert("RGB"), dtype=np.int16)
        border = np.concatenate(
            [a[:2], a[-2:], a[:, :2].swapaxes(0, 1), a[:, -2:].swapaxes(0, 1)], 1
        )
        border = border.reshape(-1, 3)
        near = np.abs(border - np.median(border, 0)).max(1) <= FLAT_TOL
        flat += bool(near.mean() >= FLAT_BORDER_SHARE)
    return flat >= FLAT_PHOTOS * len(picks)


def _place_image(
    f: SceneFrame, src: _Source, size: tuple[int, int], out_dir: Path, stem: str, move: bool
) -> str:
    """Write the frame's photo at `size` under images/; returns its path relative to out_dir."""
    if isinstance(f.image, Path) and (src.w, src.h) == size and src.fmt in SUFFIX:
        rel = f"{IMAGES_DIR}/{stem}{SUFFIX[src.fmt]}"
        # Same file system when intake moves its own extraction: a rename, no copy.
        (os.replace if move else shutil.copyfile)(f.image, out_dir / rel)
        return rel
    im = _decode(f.image, src, size, f.name)
    if src.fmt in LOSSY and im.mode == "RGB":
        rel = f"{IMAGES_DIR}/{stem}.jpg"
        im.save(out_dir / rel, quality=JPEG_QUALITY)
    else:
        rel = f"{IMAGES_DIR}/{stem}.png"
        im.save(out_dir / rel)
    return rel


def _place_mask(f: SceneFrame, src: _Source, size: tuple[int, int], out_dir: Path, stem: str):
    what = f"mask of {f.name!r}"
    try:
        if isinstance(f.mask, np.ndarray):
            m = _as_array(f.mask, what)
            m = m if m.ndim == 2 else m[..., 0]
        else:
            with _open(f.mask) as im:
                m = np.asarray(im.convert("L"))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise SceneError(f"{what} is unreadable (not a {FORMAT_NAMES} file)") from None
    if m.shape != (src.h, src.w):
        raise SceneError(
            f"{what} is {m.shape[1]}x{m.shape[0]} but the image is {src.w}x{src.h}; a mask must "
            "have its image's size"
        )
    keep = (m > 0) if f.mask_keeps_nonzero else (m == 0)
    if not keep.any():
        raise SceneError(f"{what} masks out every pixel")
    im = Image.fromarray(keep.astype(np.uint8) * 255)
    if im.size != size:
        im = im.resize(size, Image.Resampling.NEAREST)
    rel = f"{MASKS_DIR}/{stem}.png"
    im.save(out_dir / rel)
    return rel


def _distortion_entry(f: SceneFrame) -> dict[str, float] | None:
    if f.camera_model == FISHEYE:
        return {k: float(f.distortion.get(k, 0.0)) for k in FISHEYE_KEYS}
    if f.camera_model != PINHOLE:
        raise SceneError(f"{f.name!r}: camera model {f.camera_model!r} is not in the normal form")
    if not any(f.distortion.get(k) for k in DISTORTION_KEYS):
        return None
    return {k: float(f.distortion.get(k, 0.0)) for k in DISTORTION_KEYS}


def write_points3d(path: Path, xyz: np.ndarray, rgb: np.ndarray | None = None) -> int:
    """COLMAP points3D.txt (POINT3D_ID X Y Z R G B ERROR, no tracks), world frame."""
    xyz = np.asarray(xyz, dtype=np.float64).reshape(-1, 3)
    rgb = (
        np.full((len(xyz), 3), 128, np.uint8) if rgb is None else np.asarray(rgb, np.uint8)
    ).reshape(-1, 3)
    with open(path, "w") as fh:
        fh.write("# POINT3D_ID X Y Z R G B ERROR TRACK[]\n")
        for i, (p, c) in enumerate(zip(xyz, rgb), 1):
            fh.write(f"{i} {p[0]:.9g} {p[1]:.9g} {p[2]:.9g} {c[0]} {c[1]} {c[2]} 0\n")
    return len(xyz)


def write_scene(
    out_dir: Path,
    frames: list[SceneFrame],
    *,
    source_format: str,
    long_side: int | None = None,
    downscale: float | None = None,
    ngp_scale: float | None = None,
    ngp_offset: list[float] | None = None,
    aabb_scale: float | None = None,
    points_xyz: np.ndarray | None = None,
    points_rgb: np.ndarray | None = None,
    move_images: bool = False,
    up: np.ndarray | None = None,
) -> dict:
    """Write `frames` to the (new or empty) folder `out_dir` in normal form; returns cameras.json.

    `long_side` / `downscale`: training resolution (see `target_size`). `ngp_scale`/`ngp_offset`:
    an instant-ngp file's normalisation, kept; otherwise it is fitted to the training cameras.
    `aabb_scale`: the box half size; default one chosen from the cameras and points
    (`choose_aabb_scale`: 1 for a transparent or flat background). `points_xyz`/`points_rgb`
    (N, 3): sparse points in the world frame, written as points3D.txt. `move_images`: rename image files into place
    instead of copying them (they must be on the same file system). `up`: the world's up vector
    when the caller knows it (an SfM world stood upright); otherwise `world_up` of the cameras.
    Raises SceneError.
    """
    if not frames:
        raise SceneError("no frames")
    out_dir = Path(out_dir)
    assign_splits(frames)
    srcs = [_probe(f.image, f.name) for f in frames]
    c2ws = []
    for f in frames:
        m = np.eye(4)
        m[: np.shape(f.c2w)[0]] = np.asarray(f.c2w, dtype=np.float64)
        c2ws.append(m @ OPENCV_TO_OPENGL if f.axes == "opencv" else m)
    c2ws = np.stack(c2ws)
    tan_half = np.array([max(0.5 * s.w / f.fx, 0.5 * s.h / f.fy) for f, s in zip(frames, srcs)])
    train = np.array([f.split == "train" for f in frames])
    if ngp_scale is not None or ngp_offset is not None:
        scale, offset = ngp_normalization(ngp_scale, ngp_offset)
    else:
        scale, offset = fit_normalization(c2ws[train], tan_half[train])
    if aabb_scale:
        half = float(aabb_scale)
    else:
        pts = None
        if points_xyz is not None and len(points_xyz):
            pts = (np.asarray(points_xyz, dtype=np.float64).reshape(-1, 3) - offset) * scale
        empty = any(s.alpha for s in srcs) or flat_background(frames, srcs)
        half = float(choose_aabb_scale((c2ws[:, :3, 3] - offset) * scale, pts, empty))

    (out_dir / IMAGES_DIR).mkdir(parents=True, exist_ok=True)
    if any(f.mask is not None for f in frames):
        (out_dir / MASKS_DIR).mkdir(exist_ok=True)
    placed: dict[object, str] = {}
    entries = []
    for idx, (f, src, c2w) in enumerate(zip(frames, srcs, c2ws)):
        w, h = target_size(src.w, src.h, long_side, downscale)
        sx, sy = w / src.w, h / src.h
        key = (f.image if isinstance(f.image, Path) else id(f.image), w, h)
        if key not in placed:
            placed[key] = _place_image(f, src, (w, h), out_dir, f"{idx:04d}", move_images)
        entry = {
            "file": placed[key],
            "source": f.name,
            "c2w": normalize_c2w(c2w, scale, offset).tolist(),
            "fx": f.fx * sx,
            "fy": f.fy * sy,
            "cx": f.cx * sx,
            "cy": f.cy * sy,
            "w": w,
            "h": h,
            "split": f.split,
        }
        dist = _distortion_entry(f)
        if f.camera_model != PINHOLE:
            entry["camera_model"] = f.camera_model
        if dist is not None:
            entry["distortion"] = dist
        if f.mask is not None:
            entry["mask"] = _place_mask(f, src, (w, h), out_dir, f"{idx:04d}")
        entries.append(entry)
    meta = {
        "version": FORMAT_VERSION,
        "frames": entries,
        "normalization": {"scale": float(scale), "offset": np.asarray(offset).tolist()},
        "aabb": [[-half] * 3, [half] * 3],
        "has_alpha": any(s.alpha for s in srcs),
        "world_up": (world_up(c2ws[train]) if up is None else np.asarray(up, float)).tolist(),
        "source_format": source_format,
        "source_sizes": sorted({f"{s.w}x{s.h}" for s in srcs}),
    }
    if points_xyz is not None and len(points_xyz):
        meta["n_points3d"] = write_points3d(out_dir / "points3D.txt", points_xyz, points_rgb)
    if not all(math.isfinite(v) for e in entries for v in (e["fx"], e["fy"], e["cx"], e["cy"])):
        raise SceneError("intrinsics are not finite")
    (out_dir / CAMERAS_FILE).write_text(json.dumps(meta, indent=1))
    return meta
