"""SFM_MAX_SECONDS through the real API and a real preprocess worker: an SfM run past the limit
is stopped mid-run and fails the job with a message naming the setting, leaving nothing but the
job's folder; the worker goes on to the next job."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from PIL import Image

from tests.support.stack import stack_maker

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

LIMIT_S = 1
# SIFT on noise: ~3 s of feature extraction alone on two threads, well past the limit.
N, SIZE = 24, 400


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    env = {"SFM_THREADS": "2", "SFM_MAX_SECONDS": str(LIMIT_S)}
    with stack_maker(tmp_path_factory) as make:
        yield make("preprocess", env=env)


def _noise_zip(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i in range(n):
            png = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)).save(png, "PNG")
            zf.writestr(f"photos/{i:03d}.png", png.getvalue())
    return buf.getvalue()


def test_sfm_past_the_limit_fails_the_job_and_cleans_up(stack):
    ids = []
    for seed in range(2):  # the second job shows the worker free again after the first
        r = stack.submit(_noise_zip(N, seed), "photos.zip", kind="nerf")
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    for job_id in ids:
        job = stack.wait_status(job_id, "failed", "succeeded", "cancelled", timeout=120)
        assert job["status"] == "failed", job
        assert f"longer than {LIMIT_S} s (SFM_MAX_SECONDS) on {N} images" in job["error"], job
        assert job["progress"]["stage"] == "sfm"
        # stopped mid-run: the stage never reached mapping's end
        assert job["progress"]["step"] < 100, job["progress"]
        left = {p.name for p in stack.job_dir(job_id).iterdir()}
        assert not left & {"sfm", "dataset", "dataset.partial"}, left
