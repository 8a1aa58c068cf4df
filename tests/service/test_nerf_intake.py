"""NeRF dataset intake: every supported pose format, and every bad dataset refused with a clear 4xx.

Datasets are generated here: a Blender scene from the synthetic generator, converted in the test
to instant-ngp and COLMAP text forms; all three must give the same normalised cameras.
"""

from __future__ import annotations

import io
import json
import math
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from api_schemas.nerf import NerfConfig
from core.settings import Settings
from experiments.synthetic_scene import scene_files
from service.intake import IntakeError
from service.intake.nerf import validate_upload

SIZE, N_TRAIN, N_TEST = 32, 16, 4
GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])


@pytest.fixture(scope="module")
def blender() -> dict[str, bytes]:
    return scene_files(size=SIZE, n_train=N_TRAIN, n_test=N_TEST, seed=3)


def zip_bytes(files: dict[str, bytes], prefix: str = "") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(prefix + name, data)
    return buf.getvalue()


def tgz_bytes(files: dict[str, bytes], prefix: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def png(w: int, h: int, color=(200, 100, 50, 255)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGBA", (w, h), color).save(buf, "PNG")
    return buf.getvalue()


def frames_of(files, split):
    return json.loads(files[f"transforms_{split}.json"])


def with_json(files, split, data) -> dict[str, bytes]:
    return {**files, f"transforms_{split}.json": json.dumps(data).encode()}


def run_intake(tmp_path: Path, archive: bytes, name="scene.zip", config=None, settings=None):
    """validate_upload on a fresh job folder; returns (config, summary, cameras.json, job_dir)."""
    job = tmp_path / "jobs" / "job"
    (job / "upload").mkdir(parents=True, exist_ok=True)
    src = job / "upload" / name
    src.write_bytes(archive)
    cfg, summary = validate_upload(
        src, name, config or {}, job, settings or Settings(data_dir=tmp_path)
    )
    return cfg, summary, json.loads((job / "dataset" / "cameras.json").read_text()), job


def refused(
    tmp_path: Path, archive: bytes, status: int, *words: str, settings=None, config=None
) -> str:
    """Run the intake expecting IntakeError(status); checks nothing was left behind or written outside."""
    outside_before = sorted(p for p in tmp_path.rglob("*") if "jobs" not in p.parts)
    with pytest.raises(IntakeError) as ei:
        run_intake(tmp_path, archive, settings=settings, config=config)
    err = ei.value
    assert err.status_code == status, err.detail
    for w in words:
        assert w.lower() in err.detail.lower(), err.detail
    job = tmp_path / "jobs" / "job"
    assert not (job / "dataset").exists() and not (job / "dataset.partial").exists()
    assert not (job / "upload" / "extracted").exists()
    assert sorted(p for p in tmp_path.rglob("*") if "jobs" not in p.parts) == outside_before
    return err.detail


# --------------------------------------------------------------------------- conversions


def to_ngp(files: dict[str, bytes], per_frame: bool = False, **extra) -> dict[str, bytes]:
    """The Blender train+test frames as one instant-ngp transforms.json with explicit intrinsics."""
    out, frames = {}, []
    for split in ("train", "test"):
        meta = frames_of(files, split)
        f = 0.5 * SIZE / math.tan(meta["camera_angle_x"] / 2)
        for fr in meta["frames"]:
            name = f"images/{split}_{Path(fr['file_path']).name}.png"
            out[name] = files[fr["file_path"][2:] + ".png"]
            entry = {"file_path": name, "transform_matrix": fr["transform_matrix"]}
            if per_frame:
                entry.update(fl_x=f, fl_y=f, cx=SIZE / 2, cy=SIZE / 2, w=SIZE, h=SIZE)
            frames.append(entry)
    head = (
        {}
        if per_frame
        else {"fl_x": f, "fl_y": f, "cx": SIZE / 2, "cy": SIZE / 2, "w": SIZE, "h": SIZE}
    )
    out["transforms.json"] = json.dumps({**head, **extra, "frames": frames}).encode()
    return out


def rotmat_to_qvec(r: np.ndarray) -> np.ndarray:
    # Shepperd's method, as in COLMAP's rotmat2qvec.
    m = (
        np.array(
            [
                [r[0, 0] - r[1, 1] - r[2, 2], 0, 0, 0],
                [r[1, 0] + r[0, 1], r[1, 1] - r[0, 0] - r[2, 2], 0, 0],
                [r[2, 0] + r[0, 2], r[2, 1] + r[1, 2], r[2, 2] - r[0, 0] - r[1, 1], 0],
                [
                    r[2, 1] - r[1, 2],
                    r[0, 2] - r[2, 0],
                    r[1, 0] - r[0, 1],
                    r[0, 0] + r[1, 1] + r[2, 2],
                ],
            ]
        )
        / 3.0
    )
    vals, vecs = np.linalg.eigh(m)
    q = vecs[[3, 0, 1, 2], np.argmax(vals)]
    return -q if q[0] < 0 else q


def to_colmap(
    files: dict[str, bytes], model: str = "PINHOLE", params: str | None = None
) -> dict[str, bytes]:
    """The Blender train+test frames as a COLMAP text model in sparse/0 with images/ at the root."""
    out, lines = (
        {},
        [
            "# Image list with two lines of data per image:",
            "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME",
            "#   POINTS2D[] as (X, Y, POINT3D_ID)",
        ],
    )
    f = None
    k = 1
    for split in ("train", "test"):
        meta = frames_of(files, split)
        f = 0.5 * SIZE / math.tan(meta["camera_angle_x"] / 2)
        for fr in meta["frames"]:
            name = f"{split}_{Path(fr['file_path']).name}.png"
            out[f"images/{name}"] = files[fr["file_path"][2:] + ".png"]
            w2c = np.linalg.inv(np.array(fr["transform_matrix"]) @ GL_TO_CV)
            q, t = rotmat_to_qvec(w2c[:3, :3]), w2c[:3, 3]
            lines.append(
                f"{k} {' '.join(repr(float(v)) for v in q)} {' '.join(repr(float(v)) for v in t)} 1 {name}"
            )
            lines.append("" if k % 2 else "10.5 12.25 -1 3.0 4.0 7")  # POINTS2D lines, empty or not
            k += 1
    params = params or {
        "PINHOLE": f"{f!r} {f!r} {SIZE / 2} {SIZE / 2}",
        "SIMPLE_PINHOLE": f"{f!r} {SIZE / 2} {SIZE / 2}",
        "SIMPLE_RADIAL": f"{f!r} {SIZE / 2} {SIZE / 2} 0.0",
        "OPENCV": f"{f!r} {f!r} {SIZE / 2} {SIZE / 2} 0.01 -0.002 0.001 0.0005",
    }.get(model, "1 2 3")
    out["sparse/0/cameras.txt"] = f"# Camera list\n1 {model} {SIZE} {SIZE} {params}\n".encode()
    out["sparse/0/images.txt"] = ("\n".join(lines) + "\n").encode()
    out["sparse/0/points3D.txt"] = b"# empty\n"
    return out


def keyed(cams: dict, job: Path) -> dict[bytes, dict]:
    """Frames keyed by their image bytes, so frames from differently named files can be matched."""
    return {(job / "dataset" / f["file"]).read_bytes(): f for f in cams["frames"]}


def assert_same_cameras(a: dict, ja: Path, b: dict, jb: Path) -> None:
    ka, kb = keyed(a, ja), keyed(b, jb)
    assert ka.keys() == kb.keys()
    for img, fa in ka.items():
        fb = kb[img]
        np.testing.assert_allclose(fa["c2w"], fb["c2w"], atol=1e-6)
        for k in ("fx", "fy", "cx", "cy", "w", "h"):
            assert fa[k] == pytest.approx(fb[k], rel=1e-9), k
    assert a["normalization"]["scale"] == pytest.approx(b["normalization"]["scale"], rel=1e-6)
    np.testing.assert_allclose(
        a["normalization"]["offset"], b["normalization"]["offset"], atol=1e-6
    )


# --------------------------------------------------------------------------- formats


def test_blender_normal_form(tmp_path, blender):
    cfg, summary, cams, job = run_intake(tmp_path, zip_bytes(blender))
    assert cams["source_format"] == "blender" and summary["source_format"] == "blender"
    assert [f["split"] for f in cams["frames"]].count("train") == N_TRAIN
    assert [f["split"] for f in cams["frames"]].count("test") == N_TEST
    assert cams["has_alpha"] is True
    assert cams["aabb"] == [[-1, -1, -1], [1, 1, 1]]
    fov = frames_of(blender, "train")["camera_angle_x"]
    s, off = cams["normalization"]["scale"], np.array(cams["normalization"]["offset"])
    originals = frames_of(blender, "train")["frames"] + frames_of(blender, "test")["frames"]
    for f, orig in zip(cams["frames"], originals):
        assert (job / "dataset" / f["file"]).is_file()
        assert f["fx"] == pytest.approx(0.5 * SIZE / math.tan(fov / 2)) and f["cx"] == SIZE / 2
        m = np.array(orig["transform_matrix"])
        np.testing.assert_allclose(np.array(f["c2w"])[:3, :3], m[:3, :3], atol=1e-9)
        np.testing.assert_allclose(np.array(f["c2w"])[:3, 3], (m[:3, 3] - off) * s, atol=1e-9)
    # The generator's cameras all look at the origin from one distance: that is where the box goes.
    np.testing.assert_allclose(off, 0, atol=1e-6)
    dist = np.linalg.norm(np.array(originals[0]["transform_matrix"])[:3, 3])
    assert s == pytest.approx(1 / (dist * math.tan(fov / 2)), rel=1e-6)
    assert cams["world_up"] == [0, 0, 1]  # snapped to the Blender z axis
    assert cfg["backend"] == "ext" and cfg["n_levels"] == 16
    # The upload's extraction is gone; only the caller's raw upload remains.
    assert sorted(p.name for p in (job / "upload").iterdir()) == ["scene.zip"]


def test_blender_tgz_in_a_folder_with_extensions_and_val(tmp_path, blender):
    files = dict(blender)
    for split in ("train", "test"):
        meta = frames_of(files, split)
        for fr in meta["frames"]:
            fr["file_path"] += ".png"
        files = with_json(files, split, meta)
    val = frames_of(files, "test")
    val["frames"] = val["frames"][:2]
    files = with_json(files, "val", val)
    _, summary, cams, _ = run_intake(tmp_path, tgz_bytes(files, prefix="lego/"), name="lego.tar.gz")
    assert (summary["n_train"], summary["n_test"], summary["n_val"]) == (N_TRAIN, N_TEST, 2)
    assert cams["source_format"] == "blender"


def test_every_eighth_image_is_test_without_a_test_file(tmp_path, blender):
    files = {
        k: v for k, v in blender.items() if not k.startswith("test") and k != "transforms_test.json"
    }
    _, _, cams, _ = run_intake(tmp_path, zip_bytes(files))
    splits = [f["split"] for f in cams["frames"]]
    assert [i for i, s in enumerate(splits) if s == "test"] == list(range(0, N_TRAIN, 8))


def test_ngp_and_colmap_give_the_blender_cameras(tmp_path, blender):
    _, _, ref, jref = run_intake(tmp_path / "b", zip_bytes(blender))
    # Same train/test membership is not needed: cameras are matched by their image.
    _, _, ngp, jngp = run_intake(tmp_path / "n", zip_bytes(to_ngp(blender)))
    assert ngp["source_format"] == "ngp"
    assert_same_cameras(ref, jref, ngp, jngp)
    _, _, ngp_pf, jpf = run_intake(tmp_path / "p", zip_bytes(to_ngp(blender, per_frame=True)))
    assert_same_cameras(ref, jref, ngp_pf, jpf)
    for model in ("PINHOLE", "SIMPLE_PINHOLE", "SIMPLE_RADIAL"):
        _, _, col, jcol = run_intake(tmp_path / model, zip_bytes(to_colmap(blender, model)))
        assert col["source_format"] == "colmap"
        assert_same_cameras(ref, jref, col, jcol)
        assert not any("distortion" in f for f in col["frames"])


def test_colmap_opencv_keeps_distortion(tmp_path, blender):
    _, _, cams, _ = run_intake(tmp_path, zip_bytes(to_colmap(blender, "OPENCV")))
    d = cams["frames"][0]["distortion"]
    assert d == {"k1": 0.01, "k2": -0.002, "k3": 0.0, "p1": 0.001, "p2": 0.0005}


def test_ngp_scale_offset_and_aabb_scale_are_honoured(tmp_path, blender):
    s_ngp, o_ngp = 0.2, [0.5, 0.4, 0.6]
    _, _, cams, _ = run_intake(
        tmp_path, zip_bytes(to_ngp(blender, scale=s_ngp, offset=o_ngp, aabb_scale=4))
    )
    assert cams["aabb"] == [[-4, -4, -4], [4, 4, 4]]
    # instant-ngp puts a world point p at p*s + o in its [0,1]^3 cube; our box is [-1,1]^3.
    for f, orig in zip(cams["frames"], json.loads(to_ngp(blender)["transforms.json"])["frames"]):
        p = np.array(orig["transform_matrix"])[:3, 3]
        np.testing.assert_allclose(
            np.array(f["c2w"])[:3, 3], 2 * (p * s_ngp + np.array(o_ngp)) - 1, atol=1e-9
        )


def test_config_aabb_override_and_defaults(tmp_path, blender):
    cfg, _, cams, _ = run_intake(
        tmp_path, zip_bytes(blender), config={"aabb_scale": 2, "steps": 10}
    )
    assert cams["aabb"] == [[-2, -2, -2], [2, 2, 2]]
    assert cfg["steps"] == 10 and cfg["aabb_scale"] == 2 and cfg["lr"] == NerfConfig().lr


def test_mixed_sizes_with_per_frame_intrinsics_are_fine(tmp_path, blender):
    files = to_ngp(blender, per_frame=True)
    meta = json.loads(files["transforms.json"])
    fr = meta["frames"][1]
    files[fr["file_path"]] = png(SIZE * 2, SIZE)
    fr.update(w=SIZE * 2, h=SIZE, cx=SIZE)
    files["transforms.json"] = json.dumps(meta).encode()
    _, summary, cams, _ = run_intake(tmp_path, zip_bytes(files))
    assert summary["sizes"] == [f"{SIZE}x{SIZE}", f"{2 * SIZE}x{SIZE}"]
    assert cams["frames"][1]["w"] == 2 * SIZE and cams["frames"][1]["cx"] == SIZE


def test_rescaled_images_rescale_the_intrinsics(tmp_path, blender):
    files = to_ngp(blender)
    meta = json.loads(files["transforms.json"])
    meta.update(
        w=SIZE * 4,
        h=SIZE * 4,
        fl_x=meta["fl_x"] * 4,
        fl_y=meta["fl_y"] * 4,
        cx=SIZE * 2,
        cy=SIZE * 2,
    )
    files["transforms.json"] = json.dumps(meta).encode()
    _, _, cams, _ = run_intake(tmp_path, zip_bytes(files))
    f = cams["frames"][0]
    assert (f["w"], f["cx"]) == (SIZE, SIZE / 2)
    assert f["fx"] == pytest.approx(
        0.5 * SIZE / math.tan(frames_of(blender, "train")["camera_angle_x"] / 2)
    )


# --------------------------------------------------------------------------- bad input


def test_missing_image(tmp_path, blender):
    files = {k: v for k, v in blender.items() if k != "train/r_3.png"}
    refused(tmp_path, zip_bytes(files), 422, "r_3", "missing")


def test_ngp_frames_without_their_photo_are_skipped(tmp_path, blender):
    # A capture folder pruned after its poses were solved (instant-ngp's fox lists 67 frames and
    # ships 50 photos) trains on the frames it has and says which it skipped.
    files = to_ngp(blender)
    gone = json.loads(files["transforms.json"])["frames"][2]["file_path"]
    del files[gone]
    _, summary, cams, _ = run_intake(tmp_path, zip_bytes(files))
    assert len(cams["frames"]) == N_TRAIN + N_TEST - 1
    assert gone not in [f["source"] for f in cams["frames"]]
    assert summary["missing_images"] == {"count": 1, "first": [gone]}
    # With none of its photos it is still refused.
    only_json = {"transforms.json": files["transforms.json"]}
    refused(tmp_path / "none", zip_bytes(only_json), 422, "missing")


def test_unreadable_image(tmp_path, blender):
    refused(
        tmp_path,
        zip_bytes({**blender, "train/r_2.png": b"this is not a png at all"}),
        422,
        "r_2",
        "unreadable",
    )


def test_truncated_image(tmp_path, blender):
    data = blender["train/r_2.png"]
    refused(tmp_path, zip_bytes({**blender, "train/r_2.png": data[: len(data) // 2]}), 422, "r_2")


def test_mixed_image_sizes_without_per_frame_intrinsics(tmp_path, blender):
    detail = refused(
        tmp_path,
        zip_bytes({**blender, "train/r_5.png": png(SIZE + 8, SIZE)}),
        422,
        "different sizes",
    )
    assert f"{SIZE + 8}x{SIZE}" in detail


@pytest.mark.parametrize(
    "bad, words",
    [
        (lambda m: [[float("nan")] + r[1:] for r in m[:1]] + m[1:], ("nan",)),
        (
            lambda m: [[v * 2 if j < 3 else v for j, v in enumerate(r)] for r in m[:3]] + m[3:],
            ("not rigid",),
        ),
        (
            lambda m: [[-v if j == 0 else v for j, v in enumerate(r)] for r in m],
            ("not rigid",),
        ),  # mirrored
        (lambda m: m[:2], ("4x4 or 3x4",)),
        (lambda m: m[:3] + [[0, 0, 1, 1]], ("last row",)),
    ],
)
def test_bad_transform_matrix(tmp_path, blender, bad, words):
    meta = frames_of(blender, "train")
    meta["frames"][4]["transform_matrix"] = bad(meta["frames"][4]["transform_matrix"])
    refused(tmp_path, zip_bytes(with_json(blender, "train", meta)), 422, "frame 4", *words)


def test_too_few_images(tmp_path):
    files = scene_files(size=16, n_train=2, n_test=1)
    refused(tmp_path, zip_bytes(files), 422, "too few", "2 for training")


def test_unknown_colmap_camera_model(tmp_path, blender):
    refused(
        tmp_path,
        zip_bytes(to_colmap(blender, "FULL_OPENCV", params=" ".join(["0.1"] * 12))),
        422,
        "FULL_OPENCV",
        "not supported",
    )


def test_unknown_ngp_camera_model(tmp_path, blender):
    files = to_ngp(blender, camera_model="EQUIRECTANGULAR")
    refused(tmp_path, zip_bytes(files), 422, "EQUIRECTANGULAR", "not supported")


def test_colmap_wrong_parameter_count(tmp_path, blender):
    refused(
        tmp_path,
        zip_bytes(to_colmap(blender, "PINHOLE", params="100 16 16")),
        422,
        "COLMAP model in sparse/0 is unreadable",
    )


def test_no_poses(tmp_path):
    # Photos without poses go to structure from motion (tests/worker/test_sfm_*.py).
    refused(tmp_path, zip_bytes({"notes/readme.txt": b"hello"}), 422, "no camera poses")


def test_image_path_outside_the_upload(tmp_path, blender):
    meta = frames_of(blender, "train")
    meta["frames"][0]["file_path"] = "../../../etc/passwd"
    refused(tmp_path, zip_bytes(with_json(blender, "train", meta)), 422, "outside the upload")


def test_pixel_cap(tmp_path, blender):
    refused(
        tmp_path,
        zip_bytes(blender),
        422,
        "MAX_IMAGE_PIXELS",
        settings=Settings(data_dir=tmp_path, max_image_pixels=SIZE * SIZE - 1),
    )


def test_invalid_json_and_missing_fov(tmp_path, blender):
    refused(
        tmp_path,
        zip_bytes({**blender, "transforms_train.json": b"{not json"}),
        422,
        "not valid JSON",
    )
    meta = frames_of(blender, "train")
    del meta["camera_angle_x"]
    refused(tmp_path, zip_bytes(with_json(blender, "train", meta)), 422, "camera_angle_x")


def test_not_an_archive_and_empty(tmp_path, blender):
    refused(tmp_path, blender["train/r_0.png"], 415, "not a .zip")
    refused(tmp_path, b"", 422, "empty")


def test_ngp_with_jpeg_photos(tmp_path, blender):
    files = to_ngp(blender)
    meta = json.loads(files["transforms.json"])
    for fr in meta["frames"]:
        rgba = Image.open(io.BytesIO(files.pop(fr["file_path"])))
        buf = io.BytesIO()
        rgba.convert("RGB").save(buf, "JPEG", quality=95)
        fr["file_path"] = fr["file_path"].replace(".png", ".jpg")
        files[fr["file_path"]] = buf.getvalue()
    files["transforms.json"] = json.dumps(meta).encode()
    outside = sorted(tmp_path.rglob("*"))
    _, summary, cams, job = run_intake(tmp_path, zip_bytes(files))
    assert cams["has_alpha"] is False and summary["n_train"] + summary["n_test"] == N_TRAIN + N_TEST
    assert all(f["file"].endswith(".jpg") for f in cams["frames"])
    assert [p for p in tmp_path.rglob("*") if "jobs" not in p.parts] == [
        p for p in outside if "jobs" not in p.parts
    ]
    # A JPEG cut short loses its end marker and is refused.
    first = meta["frames"][3]["file_path"]
    files[first] = files[first][:-200]
    refused(tmp_path / "cut", zip_bytes(files), 422, Path(first).name, "truncated")


WEIRD = [
    None,
    "x",
    [],
    {},
    [[1, 2], [3]],
    True,
    -1,
    0,
    1e308,
    float("inf"),
    [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], ["a", 0, 0, 1]],
]


@pytest.mark.parametrize(
    "key",
    [
        "transform_matrix",
        "file_path",
        "fl_x",
        "fl_y",
        "w",
        "h",
        "cx",
        "k1",
        "camera_angle_x",
        "frames",
        "aabb_scale",
        "offset",
        "scale",
    ],
)
def test_wrong_json_values_are_4xx_never_a_crash(tmp_path, blender, key):
    for n, value in enumerate(WEIRD):
        meta = frames_of(blender, "train")
        (
            meta
            if key in ("camera_angle_x", "frames", "aabb_scale", "offset", "scale")
            else meta["frames"][2]
        )[key] = value
        try:
            run_intake(tmp_path / str(n), zip_bytes(with_json(blender, "train", meta)))
        except IntakeError as exc:
            assert exc.status_code == 422, exc.detail


@pytest.mark.parametrize("fmt", ["HEIF", "AVIF"])
def test_ngp_with_phone_format_photos(tmp_path, blender, fmt):
    """iPhones save HEIC, some Android phones AVIF: the photos are taken and stored as JPEG
    copies (browsers and the dataset's readers open those); a cut-off one is refused by name."""
    files = to_ngp(blender)
    meta = json.loads(files["transforms.json"])
    sources = {}
    for fr in meta["frames"]:
        rgb = Image.open(io.BytesIO(files.pop(fr["file_path"]))).convert("RGB")
        buf = io.BytesIO()
        rgb.save(buf, fmt, quality=95)
        fr["file_path"] = fr["file_path"].replace(".png", ".heic" if fmt == "HEIF" else ".avif")
        files[fr["file_path"]] = buf.getvalue()
        # What the photo holds (a codec's loss on 32x32 renders is not the intake's to judge).
        decoded = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
        sources[Path(fr["file_path"]).stem] = np.asarray(decoded, dtype=np.float64)
    files["transforms.json"] = json.dumps(meta).encode()
    _, summary, cams, job = run_intake(tmp_path, zip_bytes(files))
    assert summary["n_train"] + summary["n_test"] == N_TRAIN + N_TEST
    for f in cams["frames"]:
        assert f["file"].endswith(".jpg"), f
        with Image.open(job / "dataset" / f["file"]) as im:
            assert im.format == "JPEG"
            got = np.asarray(im.convert("RGB"), dtype=np.float64)
        want = sources[Path(f["source"]).stem]
        assert 10 * np.log10(255**2 / np.mean((got - want) ** 2)) > 30, f["source"]
    first = meta["frames"][3]["file_path"]
    files[first] = files[first][: len(files[first]) * 2 // 3]
    refused(tmp_path / "cut", zip_bytes(files), 422, Path(first).name)


def test_no_photos_names_what_the_archive_holds(tmp_path):
    raw = {f"DCIM/IMG_{i:04d}.DNG": b"II*\x00raw sensor data" for i in range(12)}
    detail = refused(tmp_path, zip_bytes({**raw, "notes.txt": b"x"}), 422, "no camera poses")
    assert "12 .dng" in detail and "1 .txt" in detail and "HEIF" in detail, detail
