"""The photo formats uploads may use, and the reader for the phones' own formats.

Importing this module registers pillow-heif's opener with Pillow, so `PIL.Image.open` reads HEIF
(HEIC: what iPhones, and many Android phones, save by default). Pillow reads AVIF itself. Every
module that opens uploaded photos imports it: the API's intake checks, the scene builder and the
workers. A HEIF photo opens upright: libheif applies the file's rotation and pillow-heif resets the
EXIF orientation tag, so `ImageOps.exif_transpose` leaves it as it is.

COLMAP reads PNG and JPEG only (pycolmap's `Bitmap.read` returns nothing for WebP, HEIF, AVIF);
`COLMAP_FORMATS` names them, and the SfM stage writes a JPEG or PNG copy of any other photo.
"""

from __future__ import annotations

from pathlib import Path

import pillow_heif
from PIL import Image

pillow_heif.register_heif_opener()

# Pillow's format name -> the suffix a stored copy gets.
SUFFIX = {"PNG": ".png", "JPEG": ".jpg", "WEBP": ".webp", "HEIF": ".heic", "AVIF": ".avif"}
FORMATS = tuple(SUFFIX)
# Suffixes an archive's photos are recognised by (others are not photos).
PHOTO_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".heic", ".heif", ".hif", ".avif")
# Lossy photo formats: a copy is written as JPEG (a PNG copy of a phone photo is ~5x larger).
LOSSY = ("JPEG", "HEIF", "AVIF")
# Formats whose headers say nothing about the data behind them: only decoding checks them.
DECODE_TO_CHECK = ("WEBP", "HEIF", "AVIF")
COLMAP_FORMATS = ("PNG", "JPEG")
# Pillow modes with an alpha channel (a palette or grey image may instead carry "transparency").
ALPHA_MODES = ("LA", "PA", "RGBA", "La", "RGBa")
JPEG_QUALITY = 95
FORMAT_NAMES = "PNG, JPEG, WebP, HEIF/HEIC or AVIF"


def has_alpha(mode: str, info: dict) -> bool:
    """Whether a photo of this Pillow mode and info has transparent pixels to keep."""
    return mode in ALPHA_MODES or "transparency" in info


def save_copy(im: Image.Image, fmt: str | None, dest_stem: Path) -> Path:
    """Write `im` next to `dest_stem` as JPEG (a lossy source without alpha) or PNG; returns the
    path. EXIF (camera make, focal length) is kept for COLMAP's intrinsics prior."""
    alpha = has_alpha(im.mode, im.info)
    exif = im.info.get("exif")
    if fmt in LOSSY and not alpha:
        path = dest_stem.with_suffix(".jpg")
        im.convert("RGB").save(
            path, "JPEG", quality=JPEG_QUALITY, **({"exif": exif} if exif else {})
        )
    else:
        path = dest_stem.with_suffix(".png")
        im.convert("RGBA" if alpha else "RGB").save(path, "PNG", **({"exif": exif} if exif else {}))
    return path
