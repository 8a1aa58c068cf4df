"""Photo checks from headers and container structure (no pixel decode for PNG/JPEG), and the
intrinsics of a pose file resolved against the photo's real size."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from core.photos import DECODE_TO_CHECK, FORMAT_NAMES, FORMATS, has_alpha
from service.intake import IntakeError

MODES = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK", "YCbCr", "La", "RGBa")


@dataclass
class ImageInfo:
    fmt: str
    w: int
    h: int
    alpha: bool


def jpeg_complete(path: Path) -> bool:
    """A cut-off JPEG loses its end-of-image marker; some writers pad after it."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - 65536))
        return b"\xff\xd9" in fh.read()


def inspect_image(path: Path, name: str, max_pixels: int) -> ImageInfo:
    """Header checks, then container integrity; pixels are decoded only for WebP, HEIF and AVIF
    (their headers do not say whether the data behind them is whole).

    `max_pixels` (MAX_IMAGE_PIXELS) caps one photo before anything decodes it: a decompression
    bomb is refused from its header.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                fmt, (w, h), mode, info = im.format, im.size, im.mode, dict(im.info)
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError, ValueError):
        raise IntakeError(
            422, f"image {name!r} is unreadable (not a {FORMAT_NAMES} file)"
        ) from None
    if fmt not in FORMATS:
        raise IntakeError(422, f"image {name!r} is {fmt}; photos must be {FORMAT_NAMES}")
    if w < 1 or h < 1:
        raise IntakeError(422, f"image {name!r} has no pixels")
    if w * h > max_pixels:
        raise IntakeError(
            422,
            f"image {name!r} is {w}x{h} = {w * h} pixels, over the limit of {max_pixels} "
            "(MAX_IMAGE_PIXELS)",
        )
    if mode not in MODES:
        raise IntakeError(
            422, f"image {name!r} has pixel mode {mode}; use 8-bit RGB(A) or grayscale"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                if fmt in DECODE_TO_CHECK:
                    im.load()
                else:
                    im.verify()
    except MemoryError:
        raise  # the intake child's INTAKE_MEMORY_MB, not a corrupt file
    except Exception:
        raise IntakeError(422, f"image {name!r} is truncated or corrupt") from None
    if fmt == "JPEG" and not jpeg_complete(path):
        raise IntakeError(422, f"image {name!r} is truncated (no JPEG end-of-image marker)")
    alpha = has_alpha(mode, info)
    return ImageInfo(fmt, w, h, alpha)


def resolve_intrinsics(f, img: ImageInfo) -> dict[str, float]:
    """fx, fy, cx, cy in pixels of the actual image of a `formats.RawFrame` (pose files may
    describe a rescaled copy)."""
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
