"""Upload → running with progress → succeeded → renders, on both brokers, over real HTTP."""

from __future__ import annotations

import io
import math
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from PIL import Image

import core.photos  # noqa: F401  (registers the HEIF reader)
from tests.support.stack import png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

TRAIN = {"steps": 700, "resolution": 32}


def _png(resp) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "image/png"
    return np.asarray(Image.open(io.BytesIO(resp.content)).convert("RGB"), dtype=np.float64) / 255.0


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return -10 * math.log10(float(np.mean((a - b) ** 2)))


@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_upload_train_render(stack_factory, broker):
    stack = stack_factory(redis_db=11 if broker == "redis" else None)
    photo = png_bytes(60, 45)
    r = stack.submit(photo, config=TRAIN)
    assert r.status_code == 202, r.text
    job = r.json()
    job_id = job["id"]
    assert job["status"] == "queued"
    assert job["config"]["steps"] == TRAIN["steps"] and job["config"]["encoding"] == "fourier"
    assert job["dataset"]["width"] == 60 and job["dataset"]["height"] == 45

    seen = stack.wait_for(
        job_id,
        lambda j: j["progress"]["step"] > 0 or j["status"] not in ("queued", "running"),
        what="first progress",
    )
    assert seen["status"] == "running", seen
    p = seen["progress"]
    assert p["total_steps"] == TRAIN["steps"] and 0 < p["step"] < TRAIN["steps"]
    assert p["loss"] > 0 and p["psnr"] > 0 and p["elapsed_s"] > 0 and p["eta_s"] is not None

    done = stack.wait_status(job_id, "succeeded", "failed", "cancelled")
    assert done["status"] == "succeeded", done
    assert done["progress"]["step"] == TRAIN["steps"]
    w, h = done["metrics"]["train_width"], done["metrics"]["train_height"]
    assert (w, h) == (32, 24)

    # The field at the training grid reproduces the reported PSNR against the training target.
    small = _png(stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": w, "height": h}))
    assert small.shape == (h, w, 3)
    target = (
        np.asarray(
            Image.open(io.BytesIO(photo)).convert("RGB").resize((w, h), Image.Resampling.LANCZOS),
            dtype=np.float64,
        )
        / 255.0
    )
    assert abs(_psnr(small, target) - done["metrics"]["psnr"]) < 0.5

    # Renders sample one continuous field: at 3x the training size every third sample sits on
    # a training pixel centre and must match the training-size render.
    triple = _png(
        stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": 3 * w, "height": 3 * h})
    )
    assert triple.shape == (3 * h, 3 * w, 3)
    assert np.abs(triple[1::3, 1::3] - small).max() <= 1.5 / 255
    # 4x works too and, averaged back down, still looks like the photo rather than noise.
    big = _png(
        stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": 4 * w, "height": 4 * h})
    )
    assert big.shape == (4 * h, 4 * w, 3)
    pooled = big.reshape(h, 4, w, 4, 3).mean(axis=(1, 3))
    assert _psnr(pooled, target) > _psnr(np.full_like(target, target.mean()), target) + 3

    # Concurrent renders (the API serves them from several threads) all come back intact.
    sizes = [(8 + i, 5 + i) for i in range(6)]
    with ThreadPoolExecutor(len(sizes)) as pool:
        shots = list(
            pool.map(
                lambda wh: _png(
                    httpx.post(
                        f"{stack.base_url}/v1/jobs/{job_id}/render",
                        timeout=60,
                        headers=stack.headers,
                        json={"width": wh[0], "height": wh[1]},
                    )
                ),
                sizes,
            )
        )
    assert [s.shape[:2] for s in shots] == [(h_, w_) for w_, h_ in sizes]

    # Events: ids 1..n, queued → running → succeeded, progress at least once a second.
    events = stack.events(job_id)
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
    assert statuses == ["queued", "running", "succeeded"]
    elapsed = [e["data"]["elapsed_s"] for e in events if e["event"] == "progress"]
    assert len(elapsed) >= 2 and max(np.diff(elapsed)) <= 1.0

    # The job survives an API restart; renders still work.
    stack.stop_api()
    stack.start_api()
    again = stack.client.get(f"/v1/jobs/{job_id}").json()
    assert again["status"] == "succeeded" and again["metrics"] == done["metrics"]
    assert _png(
        stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": 16, "height": 16})
    ).shape == (16, 16, 3)


def test_render_limits_on_a_trained_job(fs_stack):
    r = fs_stack.submit(png_bytes(20, 20), config={"steps": 50, "resolution": 16})
    job_id = r.json()["id"]
    assert fs_stack.wait_status(job_id, "succeeded", "failed")["status"] == "succeeded"

    too_big = fs_stack.client.post(
        f"/v1/jobs/{job_id}/render", json={"width": 4096, "height": 4096}
    )
    assert too_big.status_code == 422 and "MAX_RENDER_PIXELS" in too_big.json()["detail"]
    with_camera = fs_stack.client.post(
        f"/v1/jobs/{job_id}/render",
        json={"width": 8, "height": 8, "camera": {"c2w": [[1, 0, 0, 0]] * 4}},
    )
    assert with_camera.status_code == 422 and "camera" in with_camera.json()["detail"]
    for route in ("render/path", "render_path"):
        path = fs_stack.client.post(
            f"/v1/jobs/{job_id}/{route}", json={"width": 8, "height": 8, "orbit": {"radius": 2}}
        )
        assert path.status_code == 422 and "image jobs do not support" in path.json()["detail"]
    jpeg = fs_stack.client.post(
        f"/v1/jobs/{job_id}/render", json={"width": 24, "height": 8, "format": "jpeg"}
    )
    assert jpeg.status_code == 200 and jpeg.headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(jpeg.content)).size == (24, 8)


def test_iphone_heic_photo_trains_upright(fs_stack):
    """iPhones save HEIC, portrait shots stored sideways with a rotation to apply: the image job
    takes the file as it is and learns the photo as it is shown."""
    shown = Image.open(io.BytesIO(png_bytes(45, 60))).convert("RGB")  # portrait, as shown
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated a quarter turn, shown turned back
    buf = io.BytesIO()
    shown.transpose(Image.Transpose.ROTATE_90).save(buf, "HEIF", exif=exif.tobytes(), quality=95)
    r = fs_stack.submit(buf.getvalue(), "IMG_0042.HEIC", config={"steps": 400, "resolution": 32})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["dataset"]["format"] == "HEIF" and job["dataset"]["file"] == "image.heic"
    assert (job["dataset"]["width"], job["dataset"]["height"]) == (45, 60)
    done = fs_stack.wait_status(job["id"], "succeeded", "failed", "cancelled")
    assert done["status"] == "succeeded", done
    w, h = done["metrics"]["train_width"], done["metrics"]["train_height"]
    assert (w, h) == (24, 32)
    got = _png(fs_stack.client.post(f"/v1/jobs/{job['id']}/render", json={"width": w, "height": h}))
    target = np.asarray(shown.resize((w, h), Image.Resampling.LANCZOS), dtype=np.float64) / 255.0
    # Learned upright: far closer to the photo as shown than to it turned over.
    assert _psnr(got, target) > _psnr(got, target[::-1, ::-1]) + 3
    # The reported PSNR is against the photo's HEIF-decoded pixels.
    decoded = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    assert decoded.size == (45, 60)
    decoded = np.asarray(decoded.resize((w, h), Image.Resampling.LANCZOS), np.float64) / 255.0
    assert abs(_psnr(got, decoded) - done["metrics"]["psnr"]) < 0.5
