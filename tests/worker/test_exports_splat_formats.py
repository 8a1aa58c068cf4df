"""A splat job's files read back by readers we did not write (tests/support/splat_readers.py):
PlayCanvas' splat-transform reads the 3DGS PLY, the compressed PLY, the SOG bundle and .spz (both
versions); Niantic's own spz library (its WebAssembly build) and gsply read .spz version 4;
glTF-Transform reads the .glb with its KHR_gaussian_splatting primitive and Khronos' glTF-Validator
checks it. What they decode is compared with the Gaussians written, within each format's
quantisation; the last test does the same through the export API for a trained job."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
import torch

from tests.support.splat_readers import read
from tests.worker.test_exports_spz import gaussians
from worker.exports.compressed_ply import compressed_ply_bytes
from worker.exports.gltf_splat import glb_bytes
from worker.exports.sog import sog_bytes
from worker.exports.spz import SH_FLIP_RDF_RUB, spz_bytes
from worker.splat.ply import ply_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

scipy_spatial = pytest.importorskip("scipy.spatial")
SH_C0 = 0.28209479177387814
F = np.array([1.0, -1.0, -1.0])  # the PLY's axes -> SPZ's and glTF's (RUB)
N, NORM = 500, {"scale": 0.25, "offset": [10.0, -3.0, 2.0]}


def sigmoid(x):
    return 1 / (1 + np.exp(-np.clip(np.asarray(x, np.float64), -700, 700)))


@pytest.fixture(scope="module")
def model():
    """The Gaussians (normalised frame) and what they are in the world frame."""
    p = gaussians(N)
    s = NORM["scale"]
    q = p["quats"].double().numpy()
    world = {
        "means": p["means"].double().numpy() / s + np.array(NORM["offset"]),
        "log_scales": p["scales"].double().numpy() - np.log(s),
        "quats": q / np.linalg.norm(q, axis=1, keepdims=True),  # w, x, y, z
        "opacity": sigmoid(p["opacities"].numpy()),
        "dc": p["sh_dc"].double().numpy(),
        "rest": p["sh_rest"].double().numpy(),  # (N, 15, 3)
    }
    return p, world


def columns(got: dict) -> dict:
    """splat-transform's raw columns as arrays: means, log scales, quaternions (w, x, y, z),
    opacity (linear), DC, SH rest (N, K, 3)."""
    c = {k: np.asarray(v, np.float64) for k, v in got["columns"].items()}
    k = sum(1 for name in c if name.startswith("f_rest_")) // 3
    rest = np.stack([c[f"f_rest_{i}"] for i in range(3 * k)], 1).reshape(-1, 3, k)
    return {
        "means": np.stack([c["x"], c["y"], c["z"]], 1),
        "log_scales": np.stack([c[f"scale_{i}"] for i in range(3)], 1),
        "quats": np.stack([c[f"rot_{i}"] for i in range(4)], 1),
        "opacity": sigmoid(c["opacity"]),
        "dc": np.stack([c[f"f_dc_{i}"] for i in range(3)], 1),
        "rest": rest.transpose(0, 2, 1),
    }


def matched(decoded: np.ndarray, original: np.ndarray, atol: float) -> np.ndarray:
    """For each decoded centre, the index of the original one it is (formats that reorder the
    Gaussians: SOG and the compressed PLY sort them along a Morton curve); every original once."""
    dist, idx = scipy_spatial.cKDTree(original).query(decoded)
    assert dist.max() < atol, dist.max()
    assert sorted(idx) == list(range(len(original)))
    return idx


def same_rotation(a_wxyz: np.ndarray, b_wxyz: np.ndarray, tol: float) -> None:
    a = a_wxyz / np.linalg.norm(a_wxyz, axis=1, keepdims=True)
    b = b_wxyz / np.linalg.norm(b_wxyz, axis=1, keepdims=True)
    assert np.abs((a * b).sum(1)).min() > 1 - tol  # q and -q are one rotation


def rub(world: dict) -> dict:
    """The world frame's Gaussians in RUB axes, as .spz and glTF hold them."""
    return {
        **world,
        "means": world["means"] * F,
        "quats": world["quats"] * np.array([1.0, 1.0, -1.0, -1.0]),
        "rest": world["rest"] * SH_FLIP_RDF_RUB[:, None],
    }


def test_ply_read_by_splat_transform(tmp_path, model):
    p, world = model
    path = tmp_path / "scene.ply"
    path.write_bytes(ply_bytes(p, NORM, antialiased=True))
    got = read("splat-transform", path)
    assert got["n"] == N and got["shBands"] == 3 and got["model"] == "antialiased"
    c = columns(got)
    np.testing.assert_allclose(c["means"], world["means"], atol=1e-5)
    np.testing.assert_allclose(c["log_scales"], world["log_scales"], atol=1e-5)
    np.testing.assert_allclose(c["dc"], world["dc"], atol=1e-6)
    np.testing.assert_allclose(c["rest"], world["rest"], atol=1e-6)
    same_rotation(c["quats"], world["quats"], 1e-6)


@pytest.mark.parametrize("version", [4, 3])
def test_spz_read_by_splat_transform_and_niantic(tmp_path, model, version):
    p, world = model
    data, n = spz_bytes(p, NORM, antialiased=True, version=version)
    path = tmp_path / "scene.spz"
    path.write_bytes(data)
    want = rub(world)
    got = read("splat-transform", path)  # raw: the file's (RUB) axes
    assert got["n"] == N == n and got["shBands"] == 3 and got["model"] == "antialiased"
    c = columns(got)
    np.testing.assert_allclose(c["means"], want["means"], atol=2 / 4096)  # 12 fractional bits
    np.testing.assert_allclose(c["log_scales"], want["log_scales"], atol=1 / 32 + 1e-6)
    np.testing.assert_allclose(c["opacity"], want["opacity"], atol=1 / 255 + 1e-4)
    np.testing.assert_allclose(c["dc"], want["dc"], atol=0.5 / (0.15 * 255) + 1e-4)
    same_rotation(c["quats"], want["quats"], 2e-3)
    # 5 bits for band 1, 4 above, of c * 128 + 128
    assert np.abs(c["rest"][:, :3] - want["rest"][:, :3]).max() < 4.5 / 128
    assert np.abs(c["rest"][:, 3:] - want["rest"][:, 3:]).max() < 8.5 / 128
    if version == 4:  # Niantic's own decoder
        nia = read("spz", path)
        assert nia["n"] == N and nia["shDegree"] == 3 and nia["antialiased"] is True
        np.testing.assert_allclose(
            np.reshape(nia["positions"], (-1, 3)), want["means"], atol=2 / 4096
        )
        np.testing.assert_allclose(
            np.reshape(nia["colors"], (-1, 3)), want["dc"], atol=0.5 / (0.15 * 255) + 1e-4
        )


def test_sog_bundle_read_by_splat_transform(tmp_path, model):
    p, world = model
    data, n = sog_bytes(p, NORM, antialiased=True)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = set(zf.namelist())
        meta = json.loads(zf.read("meta.json"))
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())
    assert {"meta.json", "means_l.webp", "means_u.webp", "quats.webp", "scales.webp"} <= names
    assert {"sh0.webp", "shN_centroids.webp", "shN_labels.webp"} <= names
    assert meta["version"] == 2 and meta["count"] == N == n and meta["model"] == "antialiased"
    path = tmp_path / "scene.sog"
    path.write_bytes(data)
    got = read("splat-transform", path)
    assert got["n"] == N and got["shBands"] == 3 and got["model"] == "antialiased"
    c = columns(got)
    # 16 bits over each axis' log1p range (the scene is about 8 units across)
    idx = matched(c["means"], world["means"], atol=1e-2)
    w = {k: v[idx] for k, v in world.items()}
    assert np.abs(c["means"] - w["means"]).max() < 2e-3
    # 256-entry codebooks over the pooled values: within a small part of each value's spread
    assert np.abs(c["log_scales"] - w["log_scales"]).max() < 0.05
    assert np.abs(SH_C0 * (c["dc"] - w["dc"])).max() < 2 / 255
    np.testing.assert_allclose(c["opacity"], w["opacity"], atol=1 / 255 + 1e-4)
    same_rotation(c["quats"], w["quats"], 2e-3)  # 8 bits a component
    # SH: a palette of 256 centroids for 500 Gaussians, so a coarse match (values in -0.8..0.8)
    err = np.abs(c["rest"] - w["rest"])
    assert err.mean() < 0.25 and np.corrcoef(c["rest"].ravel(), w["rest"].ravel())[0, 1] > 0.6


def test_compressed_ply_read_by_splat_transform(tmp_path, model):
    p, world = model
    data, n = compressed_ply_bytes(p, NORM, antialiased=True)
    path = tmp_path / "scene.compressed.ply"
    path.write_bytes(data)
    got = read("splat-transform", path)
    assert got["n"] == N == n and got["shBands"] == 3 and got["model"] == "antialiased"
    c = columns(got)
    extent = np.ptp(world["means"], 0)
    idx = matched(c["means"], world["means"], atol=float(extent.max()) / 512)
    w = {k: v[idx] for k, v in world.items()}
    # 11/10/11 bits over each chunk's bounds (at most the scene's)
    assert np.all(np.abs(c["means"] - w["means"]) <= extent / 1023 / 2 + 1e-5)
    assert np.abs(c["log_scales"] - w["log_scales"]).max() <= np.ptp(world["log_scales"]) / 1023
    rgb, want = SH_C0 * c["dc"] + 0.5, SH_C0 * w["dc"] + 0.5
    assert np.abs(rgb - want).max() <= np.ptp(want) / 255 / 2 + 1e-5
    np.testing.assert_allclose(c["opacity"], w["opacity"], atol=1 / 255 + 1e-4)
    same_rotation(c["quats"], w["quats"], 2e-5 * 100)  # 10 bits a component
    assert np.abs(c["rest"] - w["rest"]).max() <= 8 / 256 + 1e-6  # 8 bits of f_rest / 8 + 0.5


def test_glb_read_by_gltf_transform_and_validated(tmp_path, model):
    p, world = model
    data, n = glb_bytes(p, NORM, antialiased=True)
    path = tmp_path / "scene.glb"
    path.write_bytes(data)
    got = read("gltf", path)
    assert got["extensionsUsed"] == ["KHR_gaussian_splatting"] and got["primitives"] == 1
    assert got["mode"] == 0  # POINTS
    assert got["extension"] == {
        "kernel": "ellipse",
        "colorSpace": "srgb_rec709_display",
        "sortingMethod": "cameraDistance",
        "projection": "perspective",
    }
    assert got["extras"] == {"antialiased": True}
    # Khronos' validator predates the extension: it flags only the extension's attribute names
    # (glTF core reserves names without a leading "_") and knows no more of it; nothing else in
    # the file (buffers, views, accessors, their bounds) is wrong
    errors = [m for m in got["validation"]["messages"] if not m.startswith("UNSUPPORTED_EXTENSION")]
    assert len(errors) == got["validation"]["errors"]
    assert all(
        m.startswith("MESH_PRIMITIVE_INVALID_ATTRIBUTE") and "KHR_gaussian_splatting:" in m
        for m in errors
    ), errors
    assert got["validation"]["warnings"] == 0
    a = {k: np.asarray(v["values"], np.float64) for k, v in got["attributes"].items()}
    assert all(v["count"] == N == n for v in got["attributes"].values())
    want = rub(world)
    np.testing.assert_allclose(a["POSITION"].reshape(-1, 3), want["means"], rtol=1e-6, atol=1e-5)
    ext = "KHR_gaussian_splatting:"
    np.testing.assert_allclose(
        a[ext + "SCALE"].reshape(-1, 3), np.exp(want["log_scales"]), rtol=1e-5
    )
    np.testing.assert_allclose(a[ext + "OPACITY"], want["opacity"], atol=1e-6)
    xyzw = a[ext + "ROTATION"].reshape(-1, 4)
    same_rotation(xyzw[:, [3, 0, 1, 2]], want["quats"], 1e-6)
    np.testing.assert_allclose(a[ext + "SH_DEGREE_0_COEF_0"].reshape(-1, 3), want["dc"], atol=1e-6)
    first = 0
    for degree in (1, 2, 3):
        for m in range(2 * degree + 1):
            got_c = a[f"{ext}SH_DEGREE_{degree}_COEF_{m}"].reshape(-1, 3)
            np.testing.assert_allclose(got_c, want["rest"][:, first + m], atol=1e-6)
        first += 2 * degree + 1
    colour = got["attributes"]["COLOR_0"]
    assert colour["normalized"] and colour["componentType"] == 5121
    rgb = np.clip(SH_C0 * want["dc"] + 0.5, 0, 1)
    rgba = a["COLOR_0"].reshape(-1, 4) / 255  # the bytes, normalised by the reader's user
    assert np.abs(rgba[:, :3] - rgb).max() <= 0.5 / 255 + 1e-6
    assert np.abs(rgba[:, 3] - want["opacity"]).max() <= 0.5 / 255 + 1e-6


def test_sh_degree_zero_and_min_opacity(tmp_path, model):
    p, world = model
    p0 = {**p, "sh_rest": torch.zeros(N, 0, 3)}
    keep = int((world["opacity"] >= 0.5).sum())
    for suffix, write in (
        ("spz", lambda: spz_bytes(p0, NORM, min_opacity=0.5)),
        ("sog", lambda: sog_bytes(p0, NORM, min_opacity=0.5)),
        ("compressed.ply", lambda: compressed_ply_bytes(p0, NORM, min_opacity=0.5)),
    ):
        data, n = write()
        path = tmp_path / f"scene.{suffix}"
        path.write_bytes(data)
        got = read("splat-transform", path)
        assert got["n"] == n == keep and got["shBands"] == 0 and got["model"] == "default", suffix


def test_nothing_opaque_enough_is_the_users_error(model):
    from worker.exports.common import ExportError

    p, world = model
    above = float(world["opacity"].max()) + 1e-6
    for write in (sog_bytes, compressed_ply_bytes, glb_bytes):
        with pytest.raises(ExportError, match="nothing to write"):
            write(p, NORM, min_opacity=above)


def test_export_api_formats_agree_with_the_jobs_gaussians(fs_stack, tmp_path):
    from experiments.synthetic_scene import Scene, Sphere, scene_files
    from tests.worker.test_exports_splat import export
    from worker.splat.ply import read_ply

    scene = Scene([Sphere((0.3, -0.2, 0.1), 0.6, ((0.9, 0.2, 0.15), (0.2, 0.3, 0.9)), (8, 4))])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, blob in scene_files(32, 16, 1, seed=3, scene=scene).items():
            zf.writestr(name, blob)
    config = {"steps": 60, "n_init_points": 800, "densify_from": 100, "n_test_renders": 0}
    r = fs_stack.submit(buf.getvalue(), "scene.zip", "splat", config, "application/zip")
    assert r.status_code == 202, r.text
    job = fs_stack.wait_status(r.json()["id"], "succeeded", "failed", timeout=240)
    assert job["status"] == "succeeded", f"{job['error']}\n{fs_stack.logs()}"
    n = job["metrics"]["n_gaussians"]
    cols = read_ply(export(fs_stack, job["id"], {"format": "gaussians"})[1])
    means = np.stack([cols["x"], cols["y"], cols["z"]], 1).astype(np.float64)
    rgb = SH_C0 * np.stack([cols[f"f_dc_{i}"] for i in range(3)], 1).astype(np.float64) + 0.5
    extent = float(np.ptp(means, 0).max())

    def check(name: str, got_means, got_rgb, pos_tol: float, rgb_tol: float, reorders: bool):
        assert len(got_means) == n, name
        if reorders:
            idx = matched(got_means, means, atol=extent / 200)
        else:
            idx = np.arange(n)
        assert np.abs(got_means - means[idx]).max() <= pos_tol, name
        assert np.abs(got_rgb - rgb[idx]).max() <= rgb_tol, name

    for fmt, suffix in (("spz", ".spz"), ("sog", ".sog"), ("compressed_ply", ".compressed.ply")):
        state, data = export(fs_stack, job["id"], {"format": fmt})
        assert state["artifact"].endswith(suffix) and state["stats"]["gaussians"] == n, state
        path = tmp_path / f"scene{suffix}"
        path.write_bytes(data)
        c = columns(read("splat-transform", path))
        got_means = c["means"] * (F if fmt == "spz" else 1)  # .spz: RUB axes
        got_rgb = SH_C0 * c["dc"] + 0.5
        tol = {
            "spz": (2 / 4096, SH_C0 * 0.5 / (0.15 * 255) + 1e-4),
            "sog": (2e-3 * max(1.0, extent), 2 / 255),
            "compressed_ply": (extent / 1023, 1 / 255),
        }[fmt]
        check(fmt, got_means, got_rgb, *tol, reorders=fmt != "spz")
    state, data = export(fs_stack, job["id"], {"format": "glb"})
    assert state["artifact"].startswith("scene-") and state["artifact"].endswith(".glb")
    path = tmp_path / "scene.glb"
    path.write_bytes(data)
    got = read("gltf", path)
    a = got["attributes"]
    pos = np.reshape(a["POSITION"]["values"], (-1, 3)) * F
    dc = np.reshape(a["KHR_gaussian_splatting:SH_DEGREE_0_COEF_0"]["values"], (-1, 3))
    check("glb", pos, SH_C0 * dc + 0.5, 1e-5, 1e-6, reorders=False)
    url = f"/v1/jobs/{job['id']}/exports"
    for body in (
        {"format": "glb", "options": {"resolution": 64}},  # a nerf mesh's option
        {"format": "sog", "options": {"version": 3}},
        {"format": "compressed_ply", "options": {"n_points": 5}},
    ):
        r = fs_stack.client.post(url, json=body)
        assert r.status_code == 422 and isinstance(r.json()["detail"], str), (body, r.text)
