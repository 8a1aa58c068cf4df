"""Uploads without camera poses for the scene kinds: a video, or an archive of plain photos.

The intake child (service/intake/sandbox.py) only checks what is cheap (the photos' headers and
container integrity; the video's frame size, container, frame count and first frame) and leaves the capture in `<job>/capture/` with a
`capture.json` manifest; structure from motion runs later on the `preprocess` queue
(worker/sfm/stage.py), which writes the normal-form dataset. The job's `dataset` says
`"sfm": "pending"` until then, which is also how the API knows to send the job there.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from core.photos import FORMAT_NAMES, PHOTO_SUFFIXES, SUFFIX
from service.intake import IntakeError

CAPTURE_DIR, MANIFEST = "capture", "capture.json"
VIDEO_SUFFIXES = (".mp4", ".mov", ".m4v", ".webm", ".mkv")
# Fewer views than this rarely reconstruct, and leave too few for training and a test view.
MIN_IMAGES = 8
MIN_VIDEO_FRAMES = 8
# Names that mark an archive as posed (service/intake/nerf.py reads them).
# ISO media brands of still photos (HEIF, AVIF): they share MP4's `ftyp` box.
STILL_BRANDS = {b"heic", b"heix", b"mif1", b"msf1", b"avif"}
POSE_FILES = ("transforms.json", "transforms_train.json", "images.txt", "images.bin")


def is_video(path: Path, filename: str) -> bool:
    """An MP4/QuickTime (`ftyp` box) or Matroska/WebM (EBML header) file, or a video name."""
    with open(path, "rb") as fh:
        head = fh.read(12)
    if head[4:8] == b"ftyp" and head[8:12] not in STILL_BRANDS:
        return True
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return True
    return Path(filename or "").suffix.lower() in VIDEO_SUFFIXES


def _visible(p: Path, root: Path) -> bool:
    parts = p.relative_to(root).parts
    return not any(part == "__MACOSX" or part.startswith(".") for part in parts)


def has_poses(root: Path) -> bool:
    return any(p.is_file() and _visible(p, root) for n in POSE_FILES for p in root.rglob(n))


def _summary(filename: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {"filename": filename, "source_format": kind, "sfm": "pending", **extra}


def _write_manifest(capture: Path, manifest: dict[str, Any]) -> None:
    (capture / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _other_files(files: list[Path]) -> str:
    """What an archive without photos holds instead (raw DNG, TIFF...), for the error message."""
    counts = Counter(p.suffix.lower() or "(no suffix)" for p in files)
    if not counts:
        return ""
    listed = ", ".join(f"{n} {s}" for s, n in counts.most_common(3))
    more = " and more" if len(counts) > 3 else ""
    return f". The archive holds {listed} files{more}; photos must be {FORMAT_NAMES}"


def accept_images(root: Path, filename: str, job_dir: Path, settings) -> dict[str, Any]:
    """Photos without poses under `root` (an extracted archive) -> `job_dir/capture/images/`."""
    from service.intake.scene.images import inspect_image

    files = sorted(
        (p for p in root.rglob("*") if p.is_file() and _visible(p, root)),
        key=lambda p: str(p.relative_to(root)),
    )
    photos = [p for p in files if p.suffix.lower() in PHOTO_SUFFIXES]
    if not photos:
        raise IntakeError(
            422,
            "no camera poses and no photos found: upload posed photos (transforms.json, "
            "transforms_train.json or a COLMAP model), a zip of plain photos for structure from "
            f"motion, or a video{_other_files(files)}",
        )
    if len(photos) < MIN_IMAGES:
        raise IntakeError(
            422,
            f"found {len(photos)} photos and no camera poses; structure from motion needs at "
            f"least {MIN_IMAGES} overlapping photos of the scene",
        )
    max_px = int(getattr(settings, "max_image_pixels", 40_000_000))
    capture = Path(job_dir) / CAPTURE_DIR
    (capture / "images").mkdir(parents=True)
    files, names = [], []
    for k, p in enumerate(photos):
        name = str(p.relative_to(root))
        info = inspect_image(p, name, max_px)
        files.append(f"{k:04d}{SUFFIX[info.fmt]}")
        names.append(name)
        os.replace(p, capture / "images" / files[-1])  # same file system: a rename
    _write_manifest(capture, {"kind": "images", "files": files, "names": names})
    return _summary(filename, "images", n_images=len(files))


def _check_frame_pixels(w: int, h: int, max_pixels: int) -> None:
    if w * h > max_pixels:
        raise IntakeError(
            422,
            f"the video is {w}x{h} = {w * h} pixels per frame, over the limit of {max_pixels} "
            "(MAX_IMAGE_PIXELS)",
        )


def probe_video(path: Path, max_pixels: int) -> dict[str, Any]:
    """Frame size from the stream header (checked before anything decodes), frame count (packets
    demuxed, none decoded), then the first frame decoded; 422 with a readable reason for
    anything SfM could not use."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise IntakeError(422, "the video file has no video stream")
            stream = container.streams.video[0]
            _check_frame_pixels(stream.codec_context.width, stream.codec_context.height, max_pixels)
            n = sum(1 for pkt in container.demux(stream) if pkt.size)
        if n < MIN_VIDEO_FRAMES:
            raise IntakeError(
                422,
                f"the video has {n} frame(s); structure from motion needs at least "
                f"{MIN_VIDEO_FRAMES} (a few seconds of footage moving around the subject)",
            )
        with av.open(str(path)) as container:
            frame = next(container.decode(container.streams.video[0]), None)
    except av.FFmpegError as exc:
        raise IntakeError(
            422, f"the video could not be read (corrupt, truncated or an unknown format): {exc}"
        ) from None
    if frame is None:
        raise IntakeError(422, "the video's first frame could not be decoded")
    _check_frame_pixels(frame.width, frame.height, max_pixels)  # the header may have lied
    return {"n_video_frames": n, "width": frame.width, "height": frame.height}


def accept_video(src_path: Path, filename: str, job_dir: Path, settings) -> dict[str, Any]:
    """A video upload -> `job_dir/capture/video<suffix>`."""
    info = probe_video(Path(src_path), int(getattr(settings, "max_image_pixels", 40_000_000)))
    capture = Path(job_dir) / CAPTURE_DIR
    capture.mkdir(parents=True)
    suffix = Path(filename or "").suffix.lower()
    name = "video" + (suffix if suffix in VIDEO_SUFFIXES else ".mp4")
    os.replace(src_path, capture / name)
    _write_manifest(capture, {"kind": "video", "video": name, "name": filename})
    return _summary(filename, "video", **info)
