"""The synthetic scene generator: Blender layout, and ground truth that agrees with geometry."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from experiments import synthetic_scene as S

REPO = Path(__file__).resolve().parents[2]


def test_cli_writes_a_blender_zip(tmp_path):
    out = tmp_path / "scene.zip"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.synthetic_scene",
            "--out",
            str(out),
            "--size",
            "32",
            "--train",
            "16",
            "--test",
            "4",
            "--seed",
            "2",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    with zipfile.ZipFile(out) as zf:
        names = set(zf.namelist())
        assert {"transforms_train.json", "transforms_test.json"} <= names
        for split, n in (("train", 16), ("test", 4)):
            meta = json.loads(zf.read(f"transforms_{split}.json"))
            assert meta["camera_angle_x"] == pytest.approx(math.radians(S.FOV_X_DEG))
            assert len(meta["frames"]) == n
            for fr in meta["frames"]:
                assert fr["file_path"].startswith(f"./{split}/") and not fr["file_path"].endswith(
                    ".png"
                )
                m = np.array(fr["transform_matrix"])
                np.testing.assert_allclose(m[:3, :3].T @ m[:3, :3], np.eye(3), atol=1e-9)
                np.testing.assert_allclose(np.linalg.norm(m[:3, 3]), S.CAMERA_DISTANCE)
                # Every camera looks at the origin (down its -z axis).
                np.testing.assert_allclose(
                    -m[:3, 2], -m[:3, 3] / np.linalg.norm(m[:3, 3]), atol=1e-9
                )
                im = Image.open(io.BytesIO(zf.read(fr["file_path"][2:] + ".png")))
                assert im.mode == "RGBA" and im.size == (32, 32)
                a = np.asarray(im)[..., 3]
                assert (
                    a[0, 0] == 0 and 0 < (a > 0).mean() < 1
                )  # transparent background, object in view


def sphere_scene(r=0.5):
    return S.Scene([S.Sphere((0.0, 0.0, 0.0), r, ((1, 0, 0), (0, 0, 1)))])


def test_sphere_silhouette_and_depth_match_geometry():
    r, d, w = 0.5, 3.0, 101
    c2w = S.look_at((0.0, -d, 0.0))
    f = 0.5 * w / math.tan(math.radians(30) / 2)
    gt = S.render(c2w, w, w, f, scene=sphere_scene(r))
    # A sphere on the optical axis projects to a disc of radius f * tan(asin(r / d)).
    radius_px = f * math.tan(math.asin(r / d))
    area = (gt["rgba"][..., 3] > 0).sum()
    assert area == pytest.approx(math.pi * radius_px**2, rel=0.02)
    assert gt["depth"][w // 2, w // 2] == pytest.approx(d - r, abs=1e-6)
    assert np.isinf(gt["depth"][0, 0]) and gt["rgba"][0, 0].tolist() == [0, 0, 0, 0]
    # Depth everywhere on the disc obeys the ray/sphere equation.
    o, dirs = S.camera_rays(c2w, w, w, f)
    hit = (gt["rgba"][..., 3] > 0).reshape(-1)
    p = o[hit] + dirs[hit] * gt["depth"].reshape(-1)[hit, None]
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), r, atol=1e-5)


def test_box_face_depth_and_lambert_shading():
    scene = S.Scene([S.Box((0.0, 0.0, 0.0), (0.4, 0.3, 0.2), ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)))])
    w = 21
    gt = S.render(S.look_at((0.0, 0.0, 3.0), up=(0.0, 1.0, 0.0)), w, w, 30.0, scene=scene)
    assert gt["depth"][w // 2, w // 2] == pytest.approx(3.0 - 0.2, abs=1e-6)
    expect = 0.5 * (S.AMBIENT + (1 - S.AMBIENT) * max(0.0, S.LIGHT[2]))  # the +z face
    assert gt["rgba"][w // 2, w // 2, 0] == pytest.approx(expect, abs=1e-6)


def test_supersampling_gives_fractional_edges_and_same_interior():
    c2w = S.look_at((0.0, -3.0, 0.0))
    one = S.render(c2w, 33, 33, 40.0, scene=sphere_scene())
    four = S.render(c2w, 33, 33, 40.0, scene=sphere_scene(), supersample=2)
    a = four["rgba"][..., 3]
    assert ((a > 0) & (a < 1)).any()
    assert (one["rgba"][..., 3] > 0).sum() == pytest.approx((a > 0.5).sum(), rel=0.1)


def test_seed_changes_poses_and_generation_is_deterministic():
    a = S.scene_files(size=8, n_train=4, n_test=2, seed=0)
    b = S.scene_files(size=8, n_train=4, n_test=2, seed=0)
    c = S.scene_files(size=8, n_train=4, n_test=2, seed=1)
    assert a == b
    assert a["transforms_test.json"] != c["transforms_test.json"]


def test_capture_scene_is_a_phone_capture_of_an_object_in_a_room(tmp_path):
    """experiments/capture_scene.py: portrait photos through a distorting lens, the room filling
    them, an instant-ngp transforms.json the intake accepts (its box chosen from the cameras),
    photos alone for SfM, and the same object in empty space."""
    from core.settings import Settings
    from experiments import capture_scene as C
    from service.intake.nerf import validate_upload

    files = C.capture_files(n_views=9, width=27, height=48, supersample=1)
    posed, unposed, alone = files["posed"], files["unposed"], files["object"]
    assert set(unposed) == set(posed) - {"transforms.json"} and len(unposed) == 9
    t = json.loads(posed["transforms.json"])
    assert (t["w"], t["h"]) == (27, 48) and t["k1"] == C.K1 and t["k2"] == C.K2
    assert "aabb_scale" not in t
    photo = np.asarray(Image.open(io.BytesIO(unposed["images/IMG_1004.jpg"])))
    assert photo.shape == (48, 27, 3)
    obj = np.asarray(Image.open(io.BytesIO(alone["images/obj_004.png"])))
    assert 0.1 < (obj[..., 3] > 0).mean() < 0.6  # the object alone leaves most of it empty
    # The lens: a ray's undistorted point, distorted again, lands on its pixel.
    lens = C.phone_lens(27, 48)
    c2w = np.eye(4)
    _, d = lens.rays(c2w)
    xu, yu = d[:, 0] / -d[:, 2], -d[:, 1] / -d[:, 2]
    r2 = xu * xu + yu * yu
    f = 1 + lens.k1 * r2 + lens.k2 * r2 * r2
    u, v = xu * f * lens.fx + lens.cx, yu * f * lens.fy + lens.cy
    i, j = np.meshgrid(np.arange(27) + 0.5, np.arange(48) + 0.5, indexing="xy")
    assert np.allclose(u, i.reshape(-1), atol=1e-4) and np.allclose(v, j.reshape(-1), atol=1e-4)
    # Every ray meets the room (nothing is transparent), and the intake takes the posed upload.
    rgba = C.render(C.room_scene(), lens, C.arc_poses(3)[1], supersample=1)
    assert (rgba[..., 3] == 1).all()
    job = tmp_path / "job"
    (job / "upload").mkdir(parents=True)
    (job / "upload" / "c.zip").write_bytes(C.zip_bytes(posed))
    validate_upload(job / "upload" / "c.zip", "c.zip", {}, job, Settings(data_dir=tmp_path))
    meta = json.loads((job / "dataset" / "cameras.json").read_text())
    assert meta["frames"][0]["distortion"]["k1"] == pytest.approx(C.K1)
    centres = np.array([f["c2w"] for f in meta["frames"]])[:, :3, 3]
    assert meta["aabb"][1][0] >= 2 * np.abs(centres).max() > 2  # the room is in the box
