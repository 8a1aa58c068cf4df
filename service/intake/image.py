"""Image job intake: header-level checks (only WebP, HEIF and AVIF photos are decoded, as nothing
cheaper says whether their data is whole)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from core.photos import DECODE_TO_CHECK, FORMAT_NAMES, SUFFIX
from service.intake import IntakeError
from service.intake.scene.images import jpeg_complete


def validate_upload(
    src_path: Path, filename: str, config: dict[str, Any], job_dir: Path, settings
) -> tuple[dict[str, Any], dict[str, Any]]:
    src_path = Path(src_path)
    if src_path.stat().st_size == 0:
        raise IntakeError(422, "the uploaded file is empty")
    try:
        with warnings.catch_warnings():
            # Our own pixel cap below replaces Pillow's bomb heuristics.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(src_path) as im:
                fmt, (w, h), mode = im.format, im.size, im.mode
    except Image.DecompressionBombError as exc:
        # Pillow's own cap is far above ours, so this is over ours too.
        raise IntakeError(
            422,
            f"image is over the pixel limit of {settings.max_image_pixels} "
            f"(MAX_IMAGE_PIXELS): {exc}",
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise IntakeError(415, f"not a {FORMAT_NAMES} image") from None
    if fmt not in SUFFIX:
        raise IntakeError(415, f"image format {fmt} is not supported; upload {FORMAT_NAMES}")
    if w < 1 or h < 1:
        raise IntakeError(422, f"image has no pixels ({w}x{h})")
    if w * h > settings.max_image_pixels:
        raise IntakeError(
            422,
            f"image is {w}x{h} = {w * h} pixels, over the limit of "
            f"{settings.max_image_pixels} (MAX_IMAGE_PIXELS)",
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(src_path) as im:
                if fmt in DECODE_TO_CHECK:
                    im.load()
                else:
                    im.verify()  # walks chunks and CRCs without decoding pixels
    except MemoryError:
        raise  # the intake child's INTAKE_MEMORY_MB, not a corrupt file
    except Exception:
        raise IntakeError(422, f"the {fmt} file is truncated or corrupt") from None
    if fmt == "JPEG" and not jpeg_complete(src_path):
        raise IntakeError(422, "the JPEG file is truncated (no end-of-image marker)")

    dataset = Path(job_dir) / "dataset"
    dataset.mkdir(parents=True, exist_ok=True)
    name = "image" + SUFFIX[fmt]
    os.replace(src_path, dataset / name)
    return config, {
        "file": name,
        "width": w,
        "height": h,
        "format": fmt,
        "mode": mode,
        "filename": filename,
    }
