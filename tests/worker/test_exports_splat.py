"""Exports of a splat job through the real API and a real Celery worker: the 3DGS PLY, the
`.splat` file web viewers load (32 bytes per Gaussian, sorted by importance, world frame) and a
point cloud, from a tiny training of one sphere."""

from __future__ import annotations

import io
import time
import zipfile

import numpy as np
import pytest

from experiments.synthetic_scene import Scene, Sphere, scene_files

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

trimesh = pytest.importorskip("trimesh")

CENTER, RADIUS = np.array([0.3, -0.2, 0.1]), 0.6
SCENE = Scene([Sphere(tuple(CENTER), RADIUS, ((0.9, 0.2, 0.15), (0.2, 0.3, 0.9)), (8, 4))])
CONFIG = {"steps": 100, "n_init_points": 1500, "densify_from": 100, "n_test_renders": 0}
SH_C0 = 0.28209479177387814


@pytest.fixture(scope="module")
def trained(fs_stack):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in scene_files(32, 16, 1, seed=3, scene=SCENE).items():
            zf.writestr(name, data)
    r = fs_stack.submit(buf.getvalue(), "scene.zip", "splat", CONFIG, "application/zip")
    assert r.status_code == 202, r.text
    job = fs_stack.wait_status(r.json()["id"], "succeeded", "failed", timeout=240)
    assert job["status"] == "succeeded", f"{job['error']}\n{fs_stack.logs()}"
    return job


def export(stack, job_id: str, body: dict, timeout: float = 60) -> tuple[dict, bytes]:
    r = stack.client.post(f"/v1/jobs/{job_id}/exports", json=body)
    assert r.status_code in (200, 202), r.text
    state, deadline = r.json(), time.monotonic() + timeout
    while state["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, f"export stuck: {state}\n{stack.logs()}"
        time.sleep(0.2)
        state = stack.client.get(f"/v1/jobs/{job_id}/exports/{state['id']}").json()
    assert state["status"] == "succeeded", f"{state}\n{stack.logs()}"
    data = stack.client.get(state["url"])
    assert data.status_code == 200
    return state, data.content


def test_splat_file_is_the_gaussians_in_viewer_layout(fs_stack, trained):
    from worker.exports.splat_files import read_splat
    from worker.splat.ply import read_ply

    job_id, n = trained["id"], trained["metrics"]["n_gaussians"]
    _, ply = export(fs_stack, job_id, {"format": "gaussians"})
    cols = read_ply(ply)
    assert len(cols["x"]) == n
    state, data = export(fs_stack, job_id, {"format": "splat"})
    assert state["artifact"].endswith(".splat") and len(data) == 32 * n == state["size"]
    s = read_splat(data)
    # sorted by importance (volume x opacity, antimatter15/splat's convert.py), from the PLY
    opacity = 1 / (1 + np.exp(-cols["opacity"].astype(np.float64)))
    importance = np.exp(cols["scale_0"] + cols["scale_1"] + cols["scale_2"]) * opacity
    xyz = np.stack([cols["x"], cols["y"], cols["z"]], 1)
    row = {tuple(p): i for i, p in enumerate(xyz)}
    order = np.array([row[tuple(p)] for p in s["position"]])  # .splat row -> PLY row
    assert sorted(order) == list(range(n))  # every Gaussian once, positions as in the PLY
    ranked = importance[order]
    assert np.all(ranked[1:] <= ranked[:-1] * (1 + 1e-5))
    scales = np.exp(np.stack([cols[f"scale_{i}"] for i in range(3)], 1))[order]
    assert np.allclose(s["scale"], scales, rtol=1e-4)
    dc = np.stack([cols[f"f_dc_{i}"] for i in range(3)], 1)[order]
    rgb = np.clip(0.5 + SH_C0 * dc, 0, 1) * 255
    assert np.abs(s["rgba"][:, :3] - rgb).max() <= 1
    assert np.abs(s["rgba"][:, 3] - opacity[order] * 255).max() <= 1
    q = np.stack([cols[f"rot_{i}"] for i in range(4)], 1)[order]
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    assert np.abs((s["rot"].astype(float) - 128) / 128 - q).max() <= 1.5 / 128


def test_point_cloud_and_bad_options(fs_stack, trained):
    state, data = export(
        fs_stack, trained["id"], {"format": "point_cloud", "options": {"n_points": 500}}
    )
    cloud = trimesh.load(io.BytesIO(data), file_type="ply")
    assert isinstance(cloud, trimesh.PointCloud) and 0 < len(cloud.vertices) <= 500
    assert state["stats"]["points"] == len(cloud.vertices)
    # the centres of the most important Gaussians above the default opacity floor (0.05)
    from worker.splat.ply import read_ply

    cols = read_ply(export(fs_stack, trained["id"], {"format": "gaussians"})[1])
    opacity = 1 / (1 + np.exp(-cols["opacity"].astype(np.float64)))
    importance = np.exp(cols["scale_0"] + cols["scale_1"] + cols["scale_2"]) * opacity
    xyz = np.stack([cols["x"], cols["y"], cols["z"]], 1)[opacity >= 0.05]
    want = xyz[np.argsort(-importance[opacity >= 0.05])][: len(cloud.vertices)]
    assert len(want) == len(cloud.vertices)
    assert np.allclose(np.sort(cloud.vertices, 0), np.sort(want, 0), atol=1e-4)
    url = f"/v1/jobs/{trained['id']}/exports"
    for body in (
        {"format": "obj"},  # a nerf mesh's file (a splat job's mesh is `mesh`)
        {"format": "glb", "options": {"threshold": 5.0}},  # a splat job's glb holds Gaussians
        {"format": "splat", "options": {"resolution": 64}},
        {"format": "point_cloud", "options": {"min_opacity": 1.5}},
        {"format": "gaussians", "extra": 1},
    ):
        r = fs_stack.client.post(url, json=body)
        assert r.status_code == 422 and isinstance(r.json()["detail"], str), (body, r.text)
