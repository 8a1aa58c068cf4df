"""The synthetic scene (experiments/synthetic_scene.py, exact ground truth) as the scene-kind
tests use it: an upload zip, the held-out photos and their poses, and image helpers."""

from __future__ import annotations

import io
import json
import math
import zipfile

import numpy as np
from PIL import Image

from experiments.synthetic_scene import scene_files


def psnr(a, b) -> float:
    """An independent PSNR (not the worker's) for checking renders against photos."""
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return -10 * math.log10(max(mse, 1e-12))


def on_white(rgba: np.ndarray) -> np.ndarray:
    return rgba[..., :3] * rgba[..., 3:4] + (1 - rgba[..., 3:4])


def decode(data: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(data))
    im.load()
    return im


def scene_upload(size: int, n_train: int, n_test: int, seed: int = 3) -> dict:
    """{"zip": upload bytes, "test_c2w" / "train_c2w": poses, "test_rgba": held-out photos (float)}."""
    files = scene_files(size, n_train, n_test, seed=seed)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    test = json.loads(files["transforms_test.json"])
    train = json.loads(files["transforms_train.json"])
    gts = [
        np.asarray(decode(files[f"test/r_{i}.png"]).convert("RGBA"), dtype=np.float64) / 255
        for i in range(n_test)
    ]
    return {
        "zip": buf.getvalue(),
        "test_c2w": [f["transform_matrix"] for f in test["frames"]],
        "train_c2w": [f["transform_matrix"] for f in train["frames"]],
        "test_rgba": gts,
    }


def train_scene(stack, scene: dict, kind: str, config: dict, timeout: float = 240) -> dict:
    """Submit the scene as `kind` and wait for it: {"id", "job"}; fails the test if it failed."""
    r = stack.submit(
        scene["zip"], "scene.zip", kind=kind, config=config, content_type="application/zip"
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    job = stack.wait_status(job_id, "succeeded", "failed", timeout=timeout)
    assert job["status"] == "succeeded", f"{job['error']}\n{stack.logs()}"
    return {"id": job_id, "job": job}


def background_baseline(scene: dict) -> float:
    """PSNR of predicting only the white background for every held-out pixel."""
    return float(
        np.mean([psnr(np.ones_like(on_white(g)), on_white(g)) for g in scene["test_rgba"]])
    )


def render_path(stack, job_id: str, **body):
    """POST /render/path with `body` as the JSON request."""
    return stack.client.post(f"/v1/jobs/{job_id}/render/path", json=body)
