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
