"""Scene intake beyond the basic formats: COLMAP binary models (written by pycolmap itself),
fisheye cameras, nerfstudio / instant-ngp masks, the training resolution, and their bad inputs
(4xx with detail, nothing left behind)."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pycolmap
import pytest
from PIL import Image

from core.settings import Settings
from experiments.synthetic_scene import scene_files
from service.intake import IntakeError
from service.intake.splat import validate_upload as splat_upload
from tests.service.test_nerf_intake import (
    GL_TO_CV,
    SIZE,
    assert_same_cameras,
    frames_of,
    refused,
    run_intake,
    to_colmap,
    to_ngp,
    zip_bytes,
)


@pytest.fixture(scope="module")
def blender() -> dict[str, bytes]:
    return scene_files(size=SIZE, n_train=12, n_test=3, seed=4)


def colmap_binary(
    files: dict[str, bytes], model: str = "PINHOLE", extra: tuple[float, ...] = (), n_points=5
) -> dict[str, bytes]:
    """The Blender train+test frames as a binary COLMAP model in sparse/0, written by pycolmap."""
    import tempfile

    rec = pycolmap.Reconstruction()
    f = None
    out: dict[str, bytes] = {}
    k = 1
    for split in ("train", "test"):
        meta = frames_of(files, split)
        f = 0.5 * SIZE / np.tan(meta["camera_angle_x"] / 2)
        if k == 1:
            fxfy = [f] if model.startswith("SIMPLE") else [f, f]
            cam = pycolmap.Camera(
                camera_id=1,
                model=model,
                width=SIZE,
                height=SIZE,
                params=[*fxfy, SIZE / 2, SIZE / 2, *extra],
            )
            rec.add_camera_with_trivial_rig(cam)
        for fr in meta["frames"]:
            name = f"{split}_{Path(fr['file_path']).name}.png"
            out[f"images/{name}"] = files[fr["file_path"][2:] + ".png"]
            w2c = np.linalg.inv(np.array(fr["transform_matrix"]) @ GL_TO_CV)
            pose = pycolmap.Rigid3d(pycolmap.Rotation3d(w2c[:3, :3]), w2c[:3, 3])
            rec.add_image_with_trivial_frame(
                pycolmap.Image(name=name, camera_id=1, image_id=k), pose
            )
            k += 1
    rng = np.random.default_rng(0)
    for _ in range(n_points):
        rec.add_point3D(rng.normal(size=3), pycolmap.Track(), np.array([10, 20, 30], np.uint8))
    with tempfile.TemporaryDirectory() as d:
        rec.write_binary(d)
        for p in Path(d).iterdir():
            out[f"sparse/0/{p.name}"] = p.read_bytes()
    assert "sparse/0/images.bin" in out
    return out


def splat_intake(tmp_path: Path, archive: bytes, config=None):
    job = tmp_path / "splat-job"
    (job / "upload").mkdir(parents=True)
    src = job / "upload" / "scene.zip"
    src.write_bytes(archive)
    return splat_upload(src, "scene.zip", config or {}, job, Settings(data_dir=tmp_path))


def mask_png(w: int, h: int, keep_left: bool, mode="L") -> bytes:
    a = np.zeros((h, w), np.uint8)
    a[:, : w // 2] = 255
    if not keep_left:
        a = 255 - a
    buf = io.BytesIO()
    Image.fromarray(a).convert(mode).save(buf, "PNG")
    return buf.getvalue()


# --------------------------------------------------------------------------- COLMAP binary


def test_colmap_binary_model_gives_the_blender_cameras_and_keeps_points(tmp_path, blender):
    _, _, ref, ref_job = run_intake(tmp_path / "a", zip_bytes(blender))
    _, summary, cams, job = run_intake(tmp_path / "b", zip_bytes(colmap_binary(blender)))
    assert cams["source_format"] == "colmap" and summary["n_train"] + summary["n_test"] == 15
    assert_same_cameras(ref, ref_job, cams, job)
    # Models without sparse points (text or binary) are posed captures all the same.
    for n, files in enumerate((colmap_binary(blender), to_colmap(blender))):
        files = {k: v for k, v in files.items() if not k.startswith("sparse/0/points3D")}
        _, _, cams, job = run_intake(tmp_path / f"c{n}", zip_bytes(files))
        assert_same_cameras(ref, ref_job, cams, job)
    _, splat_summary = splat_intake(tmp_path, zip_bytes(colmap_binary(blender, n_points=7)))
    assert splat_summary["n_points3d"] == 7
    lines = (tmp_path / "splat-job" / "dataset" / "points3D.txt").read_text().splitlines()
    assert lines[1].split()[4:7] == ["10", "20", "30"]


def test_corrupt_binary_model_is_422(tmp_path, blender):
    files = colmap_binary(blender)
    files["sparse/0/images.bin"] = files["sparse/0/images.bin"][:40]
    refused(tmp_path, zip_bytes(files), 422, "sparse/0", "unreadable")
    # A header that asks for 2^28 points of one image (6 GiB): refused, the API process untouched.
    files["sparse/0/images.bin"] = (
        struct.pack("<QI7dI", 1, 1, 1, 0, 0, 0, 0, 0, 0, 1)
        + b"a.png\x00"
        + struct.pack("<Q", 2**28)
    )
    refused(tmp_path, zip_bytes(files), 422, "sparse/0", "more memory")
    files = colmap_binary(blender, "FULL_OPENCV", extra=(0.0,) * 8)
    refused(tmp_path, zip_bytes(files), 422, "FULL_OPENCV", "not supported")


# --------------------------------------------------------------------------- fisheye


K = {"k1": 0.05, "k2": -0.01, "k3": 0.002, "k4": -0.0005}


def test_fisheye_round_trip_colmap_and_transforms(tmp_path, blender):
    _, _, a, ja = run_intake(
        tmp_path / "a", zip_bytes(colmap_binary(blender, "OPENCV_FISHEYE", tuple(K.values())))
    )
    files = to_ngp(blender, camera_model="OPENCV_FISHEYE", **K)
    _, _, b, jb = run_intake(tmp_path / "b", zip_bytes(files))
    for cams in (a, b):
        for fr in cams["frames"]:
            assert fr["camera_model"] == "OPENCV_FISHEYE"
            assert fr["distortion"] == pytest.approx(K)
    assert_same_cameras(a, ja, b, jb)
    with pytest.raises(IntakeError) as e:
        splat_intake(tmp_path, zip_bytes(files))
    assert e.value.status_code == 422 and "OPENCV_FISHEYE" in e.value.detail
    assert not (tmp_path / "splat-job" / "dataset").exists()


def test_distortion_keys_must_match_the_model(tmp_path, blender):
    refused(tmp_path, zip_bytes(to_ngp(blender, k4=0.1)), 422, "k4", "OPENCV")
    files = to_ngp(blender, camera_model="OPENCV_FISHEYE", p1=0.01)
    refused(tmp_path, zip_bytes(files), 422, "p1", "OPENCV_FISHEYE")


# --------------------------------------------------------------------------- masks


def with_masks(files: dict[str, bytes], ngp: bool, size=SIZE, broken=None) -> dict[str, bytes]:
    """instant-ngp transforms.json with a half-image mask per frame: nerfstudio `mask_path`
    (white keeps) or instant-ngp `dynamic_mask_*.png` (white never trains); both keep the left."""
    out = to_ngp(files)
    meta = json.loads(out["transforms.json"])
    for i, fr in enumerate(meta["frames"]):
        img = Path(fr["file_path"])
        if ngp:
            out[str(img.with_name(f"dynamic_mask_{img.stem}.png"))] = mask_png(size, size, False)
        else:
            fr["mask_path"] = f"masks/{img.stem}.png"
            data = mask_png(size, size, True, mode="RGB" if i % 2 else "L")
            out[f"masks/{img.stem}.png"] = broken if broken is not None and i == 1 else data
    out["transforms.json"] = json.dumps(meta).encode()
    return out


@pytest.mark.parametrize("ngp", [False, True], ids=["nerfstudio", "instant-ngp"])
def test_masks_are_kept_resized_with_one_polarity(tmp_path, blender, ngp):
    _, summary, cams, job = run_intake(
        tmp_path, zip_bytes(with_masks(blender, ngp)), config={"long_side": SIZE // 2}
    )
    assert summary["n_masked"] == len(cams["frames"])
    for fr in cams["frames"]:
        assert (fr["w"], fr["h"]) == (SIZE // 2, SIZE // 2)
        m = np.asarray(Image.open(job / "dataset" / fr["mask"]))
        assert m.shape == (SIZE // 2, SIZE // 2)
        assert (m[:, : SIZE // 4] == 255).all() and (m[:, SIZE // 4 :] == 0).all()


def test_bad_masks_are_422(tmp_path, blender):
    refused(
        tmp_path, zip_bytes(with_masks(blender, False, broken=mask_png(8, 8, True))), 422, "size"
    )
    refused(tmp_path, zip_bytes(with_masks(blender, False, broken=b"not a png")), 422, "unreadable")
    files = with_masks(blender, False)
    del files[sorted(k for k in files if k.startswith("masks/"))[2]]
    refused(tmp_path, zip_bytes(files), 422, "mask_path", "missing")
    nothing = io.BytesIO()
    Image.new("L", (SIZE, SIZE), 0).save(nothing, "PNG")
    refused(
        tmp_path,
        zip_bytes(with_masks(blender, False, broken=nothing.getvalue())),
        422,
        "masks out every pixel",
    )


# --------------------------------------------------------------------------- training size


def test_training_size_from_config_and_settings(tmp_path, blender):
    _, summary, cams, _ = run_intake(tmp_path / "a", zip_bytes(blender), config={"downscale": 2})
    assert summary["sizes"] == [f"{SIZE // 2}x{SIZE // 2}"]
    assert summary["source_sizes"] == [f"{SIZE}x{SIZE}"]
    f = cams["frames"][0]
    assert f["cx"] == pytest.approx(SIZE / 4) and f["fx"] == pytest.approx(f["fy"])
    settings = Settings(data_dir=tmp_path, train_long_side=20)
    _, summary, _, _ = run_intake(tmp_path / "b", zip_bytes(blender), settings=settings)
    assert summary["sizes"] == ["20x20"]
