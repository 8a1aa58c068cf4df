"""Phone photo formats: HEIF opens upright and its copies keep pixels and EXIF."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps

from core.photos import COLMAP_FORMATS, save_copy


def _photo(h: int = 48, w: int = 64) -> np.ndarray:
    # Smooth gradients: lossy codecs keep them well, so pixel checks can be tight.
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], -1).astype(np.uint8)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255**2 / max(mse, 1e-12)))


def _exif(orientation: int = 1) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    exif[0x0110] = "Test Phone 15"  # Model: COLMAP keys its camera database on make/model
    return exif


def test_heif_opens_upright_whatever_its_exif_orientation():
    rgb = _photo()
    buf = io.BytesIO()
    # Orientation 6: shown rotated 90 degrees clockwise, as a phone held upright stores it.
    Image.fromarray(rgb).save(buf, "HEIF", exif=_exif(6).tobytes(), quality=95)
    with Image.open(io.BytesIO(buf.getvalue())) as im:
        assert im.format == "HEIF" and im.size == (48, 64)
        upright = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    # exif_transpose leaves it as it is (no second rotation) and it is the photo as shown.
    assert upright.shape == (64, 48, 3)
    assert _psnr(upright, np.rot90(rgb, -1)) > 30


def test_copies_are_jpeg_for_lossy_photos_png_with_alpha_and_keep_exif(tmp_path):
    rgb = _photo()
    for fmt in ("HEIF", "AVIF", "WEBP"):
        src = tmp_path / f"p.{fmt.lower()}"
        Image.fromarray(rgb).save(src, fmt, exif=_exif().tobytes(), quality=95)
        with Image.open(src) as im:
            out = save_copy(im, im.format, tmp_path / f"copy_{fmt}")
        with Image.open(out) as im:
            # WebP may be lossless: written as PNG, which COLMAP reads as well as JPEG.
            assert im.format == ("PNG" if fmt == "WEBP" else "JPEG"), (fmt, im.format)
            assert im.format in COLMAP_FORMATS
            assert im.getexif().get(0x0110) == "Test Phone 15", fmt
            assert _psnr(np.asarray(im.convert("RGB")), rgb) > 30, fmt

    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 128, np.uint8)])
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.webp", "WEBP", lossless=True)
    with Image.open(tmp_path / "a.webp") as im:
        out = save_copy(im, im.format, tmp_path / "copy_alpha")
    with Image.open(out) as im:
        assert im.format == "PNG" and im.mode == "RGBA"
        assert np.array_equal(np.asarray(im), rgba)
