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


def test_aabb_scale_is_chosen_from_the_cameras_and_points():
    from core.scene_normalize import choose_aabb_scale

    cams = np.array([[2.6, 0.0, 0.5], [-2.6, 0.3, 0.5], [0.0, 2.7, 0.4]])
    # an object in empty space (transparent background) keeps the unit box
    assert choose_aabb_scale(cams, None, empty_background=True) == 1
    # the walls of a room seen by SfM, a few stray points far out
    rng = np.random.default_rng(0)
    walls = rng.uniform(-5.5, 5.5, (1000, 3))
    walls[:, 0] = np.sign(walls[:, 0]) * 5.5
    stray = np.full((5, 3), 400.0)
    assert choose_aabb_scale(cams, np.concatenate([walls, stray])) == 8
    # points inside the cameras' reach: the box still holds the cameras
    assert choose_aabb_scale(cams, rng.normal(size=(100, 3)) * 0.3) == 4
    # no points: the background is taken to be as far beyond the subject as the cameras
    assert choose_aabb_scale(cams) == 8
    assert choose_aabb_scale(cams * 100) == 128  # instant-ngp's largest
    assert choose_aabb_scale(np.zeros((3, 3)), None) == 1


def test_write_scene_chooses_the_box_unless_the_upload_gives_one(tmp_path):
    rng = np.random.default_rng(0)

    def frames(channels):
        return [
            SceneFrame(
                rng.integers(0, 255, (30, 40, channels), dtype=np.uint8),
                c2w,
                40.0,
                40.0,
                20.0,
                15.0,
            )
            for c2w in ring(9)
        ]

    meta = write_scene(tmp_path / "a", frames(3), source_format="test")
    centres = np.array([f["c2w"] for f in meta["frames"]])[:, :3, 3]
    half = meta["aabb"][1][0]
    assert half > 1 and half >= 2 * np.abs(centres).max() and half == 2 ** round(np.log2(half))
    meta = write_scene(tmp_path / "b", frames(4), source_format="test")
    assert meta["aabb"] == [[-1.0] * 3, [1.0] * 3]  # RGBA: an object in empty space
    # an object on black (a flat background): empty space too
    on_black = frames(3)
    for f in on_black:
        f.image[:] = 0
        f.image[10:20, 12:28] = rng.integers(0, 255, (10, 16, 3), dtype=np.uint8)
    meta = write_scene(tmp_path / "flat", on_black, source_format="test")
    assert meta["aabb"] == [[-1.0] * 3, [1.0] * 3]
    meta = write_scene(tmp_path / "c", frames(3), source_format="test", aabb_scale=2)
    assert meta["aabb"] == [[-2.0] * 3, [2.0] * 3]
    pts = rng.uniform(-30, 30, (200, 3))
    meta = write_scene(tmp_path / "d", frames(3), source_format="sfm", points_xyz=pts)
    s, off = meta["normalization"]["scale"], np.array(meta["normalization"]["offset"])
    inside = (np.abs((pts - off) * s) <= meta["aabb"][1][0]).all(1)
    assert inside.mean() >= 0.98
