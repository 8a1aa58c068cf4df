"""Phone photos without poses in the formats phones save (HEIC, AVIF, WebP, JPEG), through the
real API, a Celery worker on the preprocess and train queues, and pycolmap. COLMAP reads only
PNG and JPEG, so the stage decodes the others into copies first; HEIC portrait shots are stored
sideways with a rotation to apply, and must reach SfM and the dataset as they are shown. (Pose
accuracy is tests/worker/test_sfm_job.py's: on this small scene it varies from run to run with
SfM's threads, whatever the photos' formats.)"""

from __future__ import annotations

import io
import json
import math
import re
import zipfile

import numpy as np
import pytest
from PIL import Image

import core.photos  # noqa: F401  (registers the HEIF reader and writer)
from experiments.sfm_capture import make_capture
from tests.support.stack import stack_maker

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

N_FRAMES, SIZE = 24, 200
FORMATS = ("HEIF", "WEBP", "AVIF", "JPEG")
SUFFIX = {"HEIF": "HEIC", "WEBP": "webp", "AVIF": "avif", "JPEG": "jpg"}
NERF = {
    "steps": 20,
    "samples_per_step": 4096,
    "log2_hashmap_size": 14,
    "n_levels": 8,
    "occupancy_resolution": 32,
    "n_test_renders": 0,
    "checkpoint_every": 1000,
    "background": "black",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with stack_maker(tmp_path_factory) as make:
        yield make("train,render,preprocess", env={"SFM_THREADS": "2"})


@pytest.fixture(scope="module")
def capture():
    return make_capture(N_FRAMES, SIZE, n_test=1)


def _photo(rgb: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    im = Image.fromarray(rgb)
    if fmt == "HEIF":
        # As an iPhone held upright writes it: the sensor's rows, plus the turn that shows them.
        exif = Image.Exif()
        exif[0x0112] = 6
        im.transpose(Image.Transpose.ROTATE_90).save(buf, fmt, quality=95, exif=exif.tobytes())
    else:
        im.save(buf, fmt, quality=95)
    return buf.getvalue()


def _zip(capture) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i, rgb in enumerate(capture.rgb):
            fmt = FORMATS[i % len(FORMATS)]
            zf.writestr(f"DCIM/IMG_{i:04d}.{SUFFIX[fmt]}", _photo(rgb, fmt))
    return buf.getvalue()


def test_phone_formats_reconstruct_upright(stack, capture):
    r = stack.submit(_zip(capture), "phone.zip", kind="nerf", config=NERF)
    assert r.status_code == 202, r.text
    assert r.json()["dataset"]["n_images"] == N_FRAMES
    job = stack.wait_status(r.json()["id"], "succeeded", "failed", "cancelled", timeout=420)
    assert job["status"] == "succeeded", f"{job['error']}\n{stack.logs()}"
    ds = job["dataset"]
    assert ds["photos_converted"] == N_FRAMES * 3 // 4, ds  # all but the JPEGs
    assert ds["n_registered"] >= 0.9 * N_FRAMES, ds

    # The dataset holds what SfM saw: every photo as it is shown (a HEIC read sideways would be
    # a quarter turn off), in files every reader and browser opens.
    dataset = stack.job_dir(job["id"]) / "dataset"
    frames = json.loads((dataset / "cameras.json").read_text())["frames"]
    assert len(frames) == N_FRAMES
    for f in frames:
        shown = capture.rgb[int(re.search(r"IMG_(\d+)", f["source"]).group(1))]
        with Image.open(dataset / f["file"]) as im:
            assert im.format in ("JPEG", "PNG") and im.size == (SIZE, SIZE), f
            got = np.asarray(im.convert("RGB"), dtype=np.float64)
        mse = np.mean((got - shown) ** 2)
        assert 10 * math.log10(255**2 / mse) > 30, f["source"]
