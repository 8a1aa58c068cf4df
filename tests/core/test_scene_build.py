"""core.scene_build.write_scene: the one writer of the normal form (intake and SfM use it)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from core.scene_build import SceneFrame, target_size, write_scene
from core.scene_format import FISHEYE, SceneError
from core.scene_normalize import OPENCV_TO_OPENGL


def ring(n: int, radius: float = 4.0) -> list[np.ndarray]:
    """OpenGL c2w of n cameras on a circle around the origin, looking at it (z up)."""
    out = []
    for k in range(n):
        a = 2 * np.pi * k / n
        eye = np.array([radius * np.cos(a), radius * np.sin(a), 1.0])
        back = eye / np.linalg.norm(eye)  # +z of the camera points away from the target
        right = np.cross([0, 0, 1.0], back)
        right /= np.linalg.norm(right)
        m = np.eye(4)
        m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, np.cross(back, right), back, eye
        out.append(m)
    return out


def test_arrays_in_opencv_axes_downscaled_with_masks_and_points(tmp_path):
    rng = np.random.default_rng(0)
    poses = ring(9)
    frames = []
    for k, c2w in enumerate(poses):
        img = rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)
        mask = np.zeros((60, 80), np.uint8)
        mask[:, :40] = 255
        frames.append(
            SceneFrame(
                image=img,
                c2w=c2w @ OPENCV_TO_OPENGL,  # the same camera in OpenCV axes
                axes="opencv",
                fx=70.0,
                fy=70.0,
                cx=40.0,
                cy=30.0,
                name=f"f{k}",
                mask=mask,
            )
        )
    pts = rng.normal(size=(50, 3))
    meta = write_scene(tmp_path / "ds", frames, source_format="sfm", long_side=40, points_xyz=pts)
    assert json.loads((tmp_path / "ds" / "cameras.json").read_text()) == meta
    assert [f["split"] for f in meta["frames"]].count("test") == 2  # frames 0 and 8
    f0 = meta["frames"][0]
    assert (f0["w"], f0["h"]) == (40, 30)
    assert f0["fx"] == pytest.approx(35.0) and f0["cx"] == pytest.approx(20.0)
    assert Image.open(tmp_path / "ds" / f0["file"]).size == (40, 30)
    m = np.asarray(Image.open(tmp_path / "ds" / f0["mask"]))
    assert m.shape == (30, 40) and (m[:, :20] == 255).all() and (m[:, 20:] == 0).all()
    # Stored poses are OpenGL: the first camera's rotation equals the ring's.
    assert np.allclose(np.array(f0["c2w"])[:3, :3], poses[0][:3, :3])
    # The ring looks at the origin, so the fitted offset is (0, 0, ~1)-free of x and y.
    assert np.allclose(meta["normalization"]["offset"][:2], 0, atol=1e-6)
    assert meta["n_points3d"] == 50
    assert meta["world_up"] == [0.0, 0.0, 1.0]


def test_files_keep_format_unless_resized_and_fisheye_is_kept(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    frames = []
    for k, c2w in enumerate(ring(5)):
        p = src / f"{k}.jpg"
        Image.new("RGB", (64, 48), (k * 40, 10, 10)).save(p, quality=90)
        frames.append(
            SceneFrame(
                image=p,
                c2w=c2w,
                fx=50.0,
                fy=50.0,
                cx=32.0,
                cy=24.0,
                camera_model=FISHEYE,
                distortion={"k1": 0.1, "k4": -0.01},
                name=p.name,
            )
        )
    meta = write_scene(tmp_path / "a", frames, source_format="colmap")
    assert meta["frames"][1]["file"].endswith(".jpg")
    assert (tmp_path / "a" / meta["frames"][1]["file"]).read_bytes() == (src / "1.jpg").read_bytes()
    assert meta["frames"][1]["camera_model"] == FISHEYE
    assert meta["frames"][1]["distortion"] == {"k1": 0.1, "k2": 0.0, "k3": 0.0, "k4": -0.01}
    meta = write_scene(tmp_path / "b", frames, source_format="colmap", downscale=2)
    assert (meta["frames"][1]["w"], meta["frames"][1]["h"]) == (32, 24)
    assert Image.open(tmp_path / "b" / meta["frames"][1]["file"]).format == "JPEG"


def test_target_size_never_upscales():
    assert target_size(1920, 1080, long_side=800) == (800, 450)
    assert target_size(100, 50, long_side=800) == (100, 50)
    assert target_size(1920, 1080, downscale=4) == (480, 270)


def test_refusals(tmp_path):
    img = np.zeros((10, 10, 3), np.uint8)
    few = [SceneFrame(img, c2w, 10.0, 10.0, 5.0, 5.0) for c2w in ring(3)]
    with pytest.raises(SceneError, match="too few images"):
        write_scene(tmp_path / "x", few, source_format="t")
    bad_mask = [
        SceneFrame(img, c2w, 10.0, 10.0, 5.0, 5.0, mask=np.zeros((4, 4), np.uint8))
        for c2w in ring(5)
    ]
    with pytest.raises(SceneError, match="mask"):
        write_scene(tmp_path / "y", bad_mask, source_format="t")
