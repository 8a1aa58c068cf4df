"""Frames for structure from motion from a video, decoded with PyAV.

The video is cut into `target` equal runs of frames and the sharpest frame of each run is kept
(variance of the Laplacian, computed on a small grey copy): an even spread over the capture, as
ns-process-data's `num_frames_target` gives, without its motion-blurred picks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from core.photos import JPEG_QUALITY

SHARPNESS_LONG_SIDE = 480  # sharpness is judged on a copy this size: cheap, and blur still shows


class VideoError(ValueError):
    """A video that yields no usable frames; the message is for the uploader."""


@dataclass
class Frames:
    names: list[str]  # written under the output folder, in video order
    n_video_frames: int  # frames the container holds (packets demuxed)
    n_decoded: int
    width: int
    height: int


def laplacian_variance(grey: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian of a 2D image: high for sharp frames."""
    g = grey.astype(np.float32)
    lap = g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1] - 4 * g[1:-1, 1:-1]
    return float(lap.var()) if lap.size else 0.0


def _fit(w: int, h: int, long_side: int) -> tuple[int, int]:
    s = min(1.0, long_side / max(w, h))
    # even sizes: some pixel formats need them
    return max(2, round(w * s / 2) * 2), max(2, round(h * s / 2) * 2)


def count_frames(path: Path) -> int:
    """Video packets in the file (demuxed, not decoded: fast)."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoError("the file has no video stream")
            stream = container.streams.video[0]
            return sum(1 for pkt in container.demux(stream) if pkt.size)
    except av.FFmpegError as exc:
        raise VideoError(f"the video could not be read: {exc}") from None


def extract_frames(
    path: Path,
    out_dir: Path,
    target: int,
    max_long_side: int,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Frames:
    """Write the sharpest frame of each of `target` equal runs as `out_dir/frame_NNNNN.jpg`
    (long side at most `max_long_side`, display rotation applied). Raises VideoError."""
    import av

    total = count_frames(path)
    if total < 2:
        raise VideoError(f"the video has {total} frame(s); structure from motion needs many views")
    runs = min(target, total)
    out_dir.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    best: tuple[float, int, np.ndarray] | None = None  # sharpness, frame index, rgb
    run_of = lambda k: min(k * runs // total, runs - 1)  # noqa: E731
    size = None
    decoded = 0

    def flush() -> None:
        nonlocal best
        if best is None:
            return
        name = f"frame_{best[1]:05d}.jpg"
        Image.fromarray(best[2]).save(out_dir / name, quality=JPEG_QUALITY)
        names.append(name)
        best = None

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            current = 0
            for frame in container.decode(stream):
                k = decoded
                decoded += 1
                if k >= total:
                    break
                if run_of(k) != current:
                    flush()
                    current = run_of(k)
                if size is None:
                    size = _fit(frame.width, frame.height, max_long_side)
                small = _fit(frame.width, frame.height, SHARPNESS_LONG_SIDE)
                sharp = laplacian_variance(
                    frame.reformat(width=small[0], height=small[1], format="gray").to_ndarray()
                )
                if best is None or sharp > best[0]:
                    rgb = frame.reformat(width=size[0], height=size[1], format="rgb24").to_ndarray()
                    turns = round((frame.rotation or 0) / 90) % 4
                    best = (sharp, k, np.ascontiguousarray(np.rot90(rgb, turns)))
                if progress is not None:
                    progress(decoded, total)
                if cancelled is not None and decoded % 16 == 0 and cancelled():
                    return Frames(names, total, decoded, *(size or (0, 0)))
    except av.FFmpegError as exc:
        # A cut-off file decodes up to the cut; keep what came out when that is enough.
        if decoded < 2:
            raise VideoError(f"the video could not be decoded: {exc}") from None
    flush()
    if len(names) < 2 or size is None:
        raise VideoError(
            f"the video decoded to {decoded} frame(s); structure from motion needs many views"
        )
    h, w = Image.open(out_dir / names[0]).size[::-1]
    return Frames(names, total, decoded, w, h)
