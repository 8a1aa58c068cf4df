"""A splat job's mesh (`format: mesh`, worker/exports/splat_mesh.py) through the real API and a real
Celery worker: depth rendered from the training cameras fused into a TSDF volume, meshed and
decimated. On a synthetic scene of one sphere, whose surface is known, the mesh loads in trimesh
in each file format and its vertices lie on the sphere."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from experiments.synthetic_scene import Scene, Sphere, scene_files
from tests.worker.test_exports_splat import export
from worker.splat.ply import read_ply

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

trimesh = pytest.importorskip("trimesh")
pytest.importorskip("fast_simplification")

CENTER, RADIUS = np.array([0.3, -0.2, 0.1]), 0.6
SCENE = Scene([Sphere(tuple(CENTER), RADIUS, ((0.9, 0.2, 0.15), (0.2, 0.3, 0.9)), (8, 4))])
CONFIG = {
    "steps": 800,
    "n_init_points": 3000,
    "densify_from": 100,
    "n_test_renders": 0,
    "seed_points": "random",
}


@pytest.fixture(scope="module")
def trained(fs_stack):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in scene_files(48, 24, 1, seed=4, scene=SCENE).items():
            zf.writestr(name, data)
    r = fs_stack.submit(buf.getvalue(), "scene.zip", "splat", CONFIG, "application/zip")
    assert r.status_code == 202, r.text
    job = fs_stack.wait_status(r.json()["id"], "succeeded", "failed", timeout=300)
    assert job["status"] == "succeeded", f"{job['error']}\n{fs_stack.logs()}"
    return job


def photo_brightness() -> float:
    """The mean brightest channel (0-255) of the sphere's pixels in the training photos."""
    from PIL import Image

    files = scene_files(48, 24, 1, seed=4, scene=SCENE)
    px = [
        np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"), dtype=float).reshape(-1, 4)
        for name, data in files.items()
        if name.startswith("train/")
    ]
    px = np.concatenate(px)
    return float(px[px[:, 3] > 250, :3].max(1).mean())


def load(data: bytes, file_type: str) -> trimesh.Trimesh:
    mesh = trimesh.load(io.BytesIO(data), file_type=file_type, force="mesh")
    assert isinstance(mesh, trimesh.Trimesh) and len(mesh.faces) > 0
    return mesh


def test_mesh_lies_on_the_known_surface(fs_stack, trained):
    options = {"resolution": 64, "target_faces": 3000}
    state, data = export(fs_stack, trained["id"], {"format": "mesh", "options": options}, 180)
    assert state["artifact"].startswith("mesh-") and state["artifact"].endswith(".glb")
    stats = state["stats"]
    print("splat mesh stats:", {k: v for k, v in stats.items() if k != "bounds"})
    mesh = load(data, "glb")
    assert len(mesh.faces) == stats["faces"] <= 3000 * 1.05
    assert stats["faces_before_decimation"] > stats["faces"]
    off = np.abs(np.linalg.norm(mesh.vertices - CENTER, axis=1) - RADIUS)
    print(
        f"distance from the sphere: median {np.median(off):.4f}, 95 % {np.quantile(off, 0.95):.4f}"
    )
    # A voxel is 1.3 / 64 ~ 0.02 world units here. Renders put a Gaussian's depth at its centre,
    # and the opaque Gaussians of this short training (about 0.06 across) sit inside the surface
    # their footprints draw: measured median 0.045 (the mesh about 0.555 from the centre, not 0.6),
    # closer to the surface than those centres are
    # (the tail is specks the short training leaves near the sphere: 95 % measured 0.14-0.20)
    assert np.median(off) < 0.07 and np.quantile(off, 0.9) < 0.2, off
    cols = read_ply(export(fs_stack, trained["id"], {"format": "gaussians"})[1])
    centres = np.stack([cols["x"], cols["y"], cols["z"]], 1)[cols["opacity"] > 0]  # alpha > 0.5
    centre_off = np.abs(np.linalg.norm(centres - CENTER, axis=1) - RADIUS)
    assert np.median(off) < np.median(centre_off), (np.median(off), np.median(centre_off))
    # it covers the sphere all round, not a patch of it
    assert np.all(mesh.bounds[0] < CENTER - 0.8 * RADIUS) and np.all(
        mesh.bounds[1] > CENTER + 0.8 * RADIUS
    )
    # vertex colours come from the renders: the sphere's red and blue, never the black behind, and
    # about as bright as the photos show it (its shaded side included)
    colours = np.asarray(mesh.visual.vertex_colors)[:, :3].astype(float)
    assert np.mean(colours[:, 1] < colours[:, [0, 2]].max(1)) > 0.95  # green never dominates
    assert colours.max(1).mean() > 0.6 * photo_brightness(), (
        colours.max(1).mean(),
        photo_brightness(),
    )

    for fmt in ("ply", "obj"):
        state, data = export(
            fs_stack, trained["id"], {"format": "mesh", "options": {**options, "format": fmt}}, 180
        )
        assert state["artifact"].endswith(f".{fmt}")
        other = load(data, fmt)
        assert abs(len(other.vertices) - len(mesh.vertices)) <= 0.02 * len(mesh.vertices) + 2
        off = np.abs(np.linalg.norm(other.vertices - CENTER, axis=1) - RADIUS)
        assert np.median(off) < 0.07, fmt


def test_mesh_options(fs_stack, trained):
    url = f"/v1/jobs/{trained['id']}/exports"
    for body in (
        {"format": "mesh", "options": {"threshold": 2.0}},  # a nerf mesh's option
        {"format": "mesh", "options": {"format": "stl"}},
        {"format": "mesh", "options": {"resolution": 100_000}},  # over MAX_EXPORT_RESOLUTION
        {"format": "mesh", "options": {"target_faces": -1}},
    ):
        r = fs_stack.client.post(url, json=body)
        assert r.status_code == 422 and isinstance(r.json()["detail"], str), (body, r.text)
