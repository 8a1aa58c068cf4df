"""Image and animation encoding for renders (Pillow)."""

from __future__ import annotations

import io
import zipfile

import numpy as np
from PIL import Image
from PIL.PngImagePlugin import PngInfo

CONTENT_TYPES = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "webp": "image/webp",
    "gif": "image/gif",
    "zip": "application/zip",
}


def to_uint8(img: np.ndarray) -> np.ndarray:
    return (np.clip(img, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def encode_image(pixels: np.ndarray, fmt: str, text: dict[str, str] | None = None) -> bytes:
    """uint8 (H, W, 3) or (H, W) -> PNG (with `text` as tEXt chunks) or JPEG bytes."""
    im = Image.fromarray(pixels, "RGB" if pixels.ndim == 3 else "L")
    buf = io.BytesIO()
    if fmt == "png":
        info = PngInfo()
        for k, v in (text or {}).items():
            info.add_text(k, str(v))
        im.save(buf, format="PNG", pnginfo=info)
    elif fmt == "jpeg":
        im.save(buf, format="JPEG", quality=92)
    else:
        raise ValueError(f"unknown image format {fmt!r}")
    return buf.getvalue()


def encode_frames(frames: list[np.ndarray], fmt: str, fps: int) -> bytes:
    """uint8 frames -> animated WebP / GIF, or a zip of PNGs (frame_000.png, ...)."""
    buf = io.BytesIO()
    if fmt == "zip":
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
            for i, f in enumerate(frames):
                zf.writestr(f"frame_{i:03d}.png", encode_image(f, "png"))
        return buf.getvalue()
    mode = "RGB" if frames[0].ndim == 3 else "L"
    ims = [Image.fromarray(f, mode) for f in frames]
    duration = max(1, round(1000 / fps))
    if fmt == "webp":
        ims[0].save(
            buf,
            format="WEBP",
            save_all=True,
            append_images=ims[1:],
            duration=duration,
            loop=0,
            quality=90,
        )
    elif fmt == "gif":
        ims[0].save(
            buf, format="GIF", save_all=True, append_images=ims[1:], duration=duration, loop=0
        )
    else:
        raise ValueError(f"unknown animation format {fmt!r}")
    return buf.getvalue()
