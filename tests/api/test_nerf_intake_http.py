"""kind=nerf uploads over real HTTP through the real app (API process only: intake happens before
anything is enqueued, so no worker is needed to see a dataset accepted or refused)."""

from __future__ import annotations

import io
import json

import pytest

from experiments.synthetic_scene import scene_files
from tests.service.test_nerf_intake import zip_bytes as zipped


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from tests.support.stack import stack_maker

    with stack_maker(tmp_path_factory) as make:
        yield make(queues=None)


@pytest.fixture(scope="module")
def scene():
    return scene_files(size=24, n_train=10, n_test=3, seed=5)


def test_upload_is_validated_into_the_normal_form(api, scene):
    r = api.submit(zipped(scene), "scene.zip", kind="nerf", config={"steps": 50})
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["kind"] == "nerf" and job["status"] == "queued" and job["config"]["steps"] == 50
    cams = json.loads((api.job_dir(job["id"]) / "dataset" / "cameras.json").read_text())
    assert [f["split"] for f in cams["frames"]].count("test") == 3
    assert all((api.job_dir(job["id"]) / "dataset" / f["file"]).is_file() for f in cams["frames"])
    assert not (api.job_dir(job["id"]) / "upload").exists()


@pytest.mark.parametrize(
    "case, status, words",
    [
        ("slip", 400, "outside"),
        ("missing", 422, "missing"),
        ("bad_config", 422, "steps"),
        ("both_sizes", 422, "long_side or downscale"),
        ("not_archive", 415, "not a .zip"),
    ],
)
def test_bad_uploads_are_refused_and_leave_nothing(api, scene, case, status, words):
    before = api.job_dirs()
    config = None
    if case == "slip":
        data = zipped({**scene, "../../escape.txt": b"x"})
    elif case == "missing":
        data = zipped({k: v for k, v in scene.items() if k != "train/r_1.png"})
    elif case == "bad_config":
        data, config = zipped(scene), {"steps": -1}
    elif case == "both_sizes":
        data, config = zipped(scene), {"long_side": 100, "downscale": 2}
    else:
        data = scene["train/r_0.png"]
    r = api.submit(data, "scene.zip", kind="nerf", config=config)
    assert r.status_code == status, r.text
    assert words in r.json()["detail"]
    assert api.job_dirs() == before
    assert not list(api.data_dir.parent.rglob("escape.txt"))


def phone_capture(n: int = 60, w: int = 1920, h: int = 1080) -> bytes:
    """n JPEG photos of w x h on a ring around the origin, as instant-ngp's colmap2nerf writes
    them (transforms.json with fl_x/cx/w/h, OpenCV distortion, aabb_scale 4)."""
    import numpy as np
    from PIL import Image

    yy, xx = np.mgrid[0:h:4, 0:w:4]
    frames, files = [], {}
    for k in range(n):
        a = 2 * np.pi * k / n
        eye = np.array([3 * np.cos(a), 3 * np.sin(a), 0.5])
        back = eye / np.linalg.norm(eye)
        right = np.cross([0.0, 0.0, 1.0], back)
        right /= np.linalg.norm(right)
        c2w = np.eye(4)
        c2w[:3, 0], c2w[:3, 1], c2w[:3, 2], c2w[:3, 3] = right, np.cross(back, right), back, eye
        small = np.stack(
            [(xx * 255 // w + 4 * k) % 256, yy * 255 // h, ((xx + yy) // 8 + 9 * k) % 256], -1
        ).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(small).resize((w, h)).save(buf, "JPEG", quality=80)
        files[f"images/{k:04d}.jpg"] = buf.getvalue()
        frames.append({"file_path": f"images/{k:04d}.jpg", "transform_matrix": c2w.tolist()})
    meta = {
        "fl_x": 1500.0,
        "fl_y": 1500.0,
        "cx": w / 2,
        "cy": h / 2,
        "w": w,
        "h": h,
        "k1": 0.01,
        "k2": -0.002,
        "p1": 0.0,
        "p2": 0.0,
        "aabb_scale": 4,
        "frames": frames,
    }
    files["transforms.json"] = json.dumps(meta).encode()
    return zipped(files)


@pytest.fixture(scope="module")
def capture():
    return phone_capture()


def test_large_photos_are_downsized_to_the_training_size(api, capture):
    r = api.submit(capture, "capture.zip", kind="nerf")
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["dataset"]["sizes"] == ["800x450"] and job["dataset"]["source_sizes"] == [
        "1920x1080"
    ]
    cams = json.loads((api.job_dir(job["id"]) / "dataset" / "cameras.json").read_text())
    f = cams["frames"][0]
    assert f["fx"] == pytest.approx(1500 * 800 / 1920) and f["cy"] == pytest.approx(225)
    assert cams["aabb"][1] == [4.0] * 3 and len(cams["frames"]) == 60


@pytest.mark.slow
def test_large_photos_train_at_the_downscaled_size(tmp_path_factory, capture):
    from PIL import Image

    from tests.support.stack import stack_maker

    config = {
        "long_side": 64,
        "steps": 30,
        "samples_per_step": 4096,
        "max_rays_per_step": 1024,
        "log2_hashmap_size": 14,
        "n_levels": 4,
        "occupancy_resolution": 16,
        "max_samples_per_ray": 64,
        "n_test_renders": 1,
    }
    with stack_maker(tmp_path_factory) as make:
        stack = make(queues="train,render")
        r = stack.submit(capture, "capture.zip", kind="nerf", config=config)
        assert r.status_code == 202, r.text
        job = stack.wait_status(r.json()["id"], "succeeded", "failed", timeout=240)
        assert job["status"] == "succeeded", f"{job['error']}\n{stack.logs()}"
        assert job["dataset"]["sizes"] == ["64x36"]
        renders = [
            p for p in (stack.job_dir(job["id"]) / "artifacts").iterdir() if p.suffix == ".png"
        ]
        assert renders and all(Image.open(p).size[1] == 36 for p in renders)
