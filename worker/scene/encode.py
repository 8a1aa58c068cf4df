"""Encodings of renders: PNG/JPEG frames and WebP/GIF/zip animations (Pillow), H.264 MP4 (PyAV),
and depth as 16-bit PNG in millimetres or float32 .npy."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable
from typing import BinaryIO

import numpy as np
from PIL import Image
from PIL.PngImagePlugin import PngInfo

CONTENT_TYPES = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "webp": "image/webp",
    "gif": "image/gif",
    "zip": "application/zip",
    "mp4": "video/mp4",
    "png16": "image/png",
    "npy": "application/x-npy",
}
# Largest depth a 16-bit millimetre PNG holds (65.535 m); farther surfaces are clipped to it.
PNG16_MAX_MM = 65535


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


def depth_png16(depth: np.ndarray, hit: np.ndarray) -> bytes:
    """(H, W) depth in world units -> 16-bit greyscale PNG of millimetres (the convention of
    RGB-D datasets such as TUM and ScanNet, which assume metres as world units); 0 = no surface."""
    mm = np.where(hit & (depth > 0), np.round(depth.astype(np.float64) * 1000.0), 0.0)
    buf = io.BytesIO()
    Image.fromarray(np.clip(mm, 0, PNG16_MAX_MM).astype(np.uint16)).save(buf, format="PNG")
    return buf.getvalue()


def depth_npy(depth: np.ndarray, hit: np.ndarray) -> bytes:
    """(H, W) float32 depth in world units as a NumPy .npy file; 0 = no surface."""
    buf = io.BytesIO()
    np.save(buf, np.where(hit, depth, 0.0).astype(np.float32), allow_pickle=False)
    return buf.getvalue()


def encode_mp4(frames: Iterable[np.ndarray], fps: int, out: BinaryIO) -> None:
    """uint8 (H, W, 3) or (H, W) frames -> H.264 MP4, yuv420p (what browsers and players decode),
    at `fps`, written to `out` one frame at a time. Width and height must be even (4:2:0 chroma)."""
    import av

    container, stream = None, None
    try:
        for f in frames:
            if stream is None:
                h, w = f.shape[:2]
                if h % 2 or w % 2:
                    raise ValueError(
                        f"H.264 with yuv420p needs an even width and height, not {w}x{h}"
                    )
                container = av.open(out, mode="w", format="mp4")
                stream = container.add_stream("libx264", rate=fps)
                stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
                stream.options = {"crf": "18", "preset": "medium"}
            rgb = f if f.ndim == 3 else np.repeat(f[..., None], 3, axis=2)
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        if stream is None:
            raise ValueError("no frames to encode")
        for packet in stream.encode():
            container.mux(packet)
    finally:
        if container is not None:
            container.close()


def encode_frames(
    frames: Iterable[np.ndarray], fmt: str, fps: int, out: BinaryIO | None = None
) -> bytes:
    """uint8 frames -> animated WebP / GIF, H.264 MP4, or a zip of PNGs (frame_000.png, ...).
    With `out`, writes there (MP4 and zip then hold one frame at a time) and returns b""."""
    buf = io.BytesIO() if out is None else out
    if fmt == "mp4":
        encode_mp4(frames, fps, buf)
        return buf.getvalue() if out is None else b""
    if fmt == "zip":
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
            for i, f in enumerate(frames):
                zf.writestr(f"frame_{i:03d}.png", encode_image(f, "png"))
        return buf.getvalue() if out is None else b""
    frames = list(frames)
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
    return buf.getvalue() if out is None else b""
