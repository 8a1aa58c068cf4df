"""Phone photos stored turned with an EXIF orientation reach SfM upright (worker/sfm/stage.py
colmap_readable): COLMAP reads pixels as stored, so a portrait shot would reconstruct on its side."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps

from worker.sfm.stage import EXIF_ORIENTATION, colmap_readable


def jpeg(pixels: np.ndarray, orientation: int | None) -> bytes:
    im = Image.fromarray(pixels)
    exif = Image.Exif()
    if orientation is not None:
        exif[EXIF_ORIENTATION] = orientation
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


def test_turned_photos_get_upright_copies_and_upright_ones_are_linked(tmp_path):
    # stored 64 wide x 40 high, red growing rightwards, green downwards (smooth: JPEG keeps it);
    # orientation 6 means "turn 90 degrees clockwise to view"
    y, x = np.mgrid[0:40, 0:64]
    stored = np.stack([x * 4, y * 6, np.full_like(x, 128)], -1).astype(np.uint8)
    src = tmp_path / "capture"
    src.mkdir()
    (src / "portrait.jpg").write_bytes(jpeg(stored, 6))
    (src / "landscape.jpg").write_bytes(jpeg(stored, 1))
    (src / "plain.jpg").write_bytes(jpeg(stored, None))
    files = ["portrait.jpg", "landscape.jpg", "plain.jpg"]
    seen = []
    out_dir, out = colmap_readable(
        src, files, tmp_path / "photos", lambda k, n: seen.append((k, n)), lambda: False
    )
    assert out_dir == tmp_path / "photos" and out == files and seen == [(1, 1)]
    with Image.open(out_dir / "portrait.jpg") as im:
        assert im.size == (40, 64)  # upright: 40 wide, 64 high
        assert im.getexif().get(EXIF_ORIENTATION, 1) == 1  # nothing left to turn
        got = np.asarray(im.convert("RGB"), np.float64)
    with Image.open(src / "portrait.jpg") as orig:
        want = np.asarray(ImageOps.exif_transpose(orig).convert("RGB"), np.float64)
    assert np.abs(got - want).mean() < 4  # the same picture, re-encoded once
    assert np.abs(got - np.rot90(stored.astype(np.float64), -1)).mean() < 4  # turned clockwise
    for f in ("landscape.jpg", "plain.jpg"):  # upright already: the file itself
        assert (out_dir / f).read_bytes() == (src / f).read_bytes()
    # every photo upright and readable: SfM reads the capture folder itself
    upright = ["landscape.jpg", "plain.jpg"]
    assert colmap_readable(src, upright, tmp_path / "x", lambda k, n: None, lambda: False) == (
        src,
        upright,
    )
