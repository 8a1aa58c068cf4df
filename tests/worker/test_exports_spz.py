"""`.spz` export (worker/exports/spz.py), versions 4 (ZSTD, the default) and 3 (gzip), read back
by an independent reader, gsply (a PyPI package that reads Niantic's format with its own decoder),
and through the real export API from a job trained with strategy mcmc and the antialiasing
filter. (tests/worker/test_exports_splat_formats.py reads them with Niantic's own library and
PlayCanvas' splat-transform.)"""

from __future__ import annotations

import gzip
import io
import struct
import zipfile

import numpy as np
import pytest
import torch

from experiments.synthetic_scene import Scene, Sphere, scene_files
from kernels.sh import sh_reference
from kernels.splat_project import quat_to_rotmat
from tests.worker.test_exports_splat import export
from worker.exports.spz import spz_bytes
from worker.splat import model as gm

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

gsply = pytest.importorskip("gsply")
F = np.diag([1.0, -1.0, -1.0])  # PLY's RDF axes -> SPZ's RUB axes


def read(tmp_path, data: bytes):
    path = tmp_path / "scene.spz"
    path.write_bytes(data)
    return gsply.read_spz(path)


def header(data: bytes) -> tuple:
    """(magic, version, points, sh degree, fractional bits, flags, reserved (v3) or number of
    streams (v4)), per the spec: version 3 is one gzip stream, version 4's header is plain."""
    head = gzip.decompress(data)[:16] if data[:2] == b"\x1f\x8b" else data[:16]
    return struct.unpack("<IIIBBBB", head)


def gaussians(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = gm.init_tensors(torch.rand(n, 3, generator=g) * 2 - 1, torch.rand(n, 3, generator=g), 3)
    p["scales"] = torch.rand(n, 3, generator=g) * 4 - 6
    p["quats"] = torch.randn(n, 4, generator=g)
    p["opacities"] = torch.randn(n, generator=g) * 2
    p["sh_rest"] = (torch.rand(n, 15, 3, generator=g) * 2 - 1) * 0.8
    return p


@pytest.mark.parametrize("version", [4, 3])
def test_round_trip_through_an_independent_reader(tmp_path, version):
    n, norm = 500, {"scale": 0.25, "offset": [10.0, -3.0, 2.0]}
    p = gaussians(n)
    data, written = spz_bytes(p, norm, antialiased=True, version=version)
    assert written == n
    magic, got_version, count, degree, bits, flags, last = header(data)
    assert (magic, got_version, count, degree, flags & 1) == (0x5053474E, version, n, 3, 1)
    assert last == (6 if version == 4 else 0)  # v4: six ZSTD streams; v3: reserved
    assert (data[:2] == b"\x1f\x8b") == (version == 3)
    assert header(spz_bytes(p, norm, version=version)[0])[5] == 0  # no filter, no flag

    got = read(tmp_path, data)
    world = p["means"].double().numpy() / 0.25 + np.array(norm["offset"])
    np.testing.assert_allclose(got.means, world @ F, atol=2.0 / (1 << bits))
    np.testing.assert_allclose(got.scales, p["scales"].numpy() - np.log(0.25), atol=1 / 32 + 1e-6)
    alpha = torch.sigmoid(p["opacities"]).numpy()
    np.testing.assert_allclose(1 / (1 + np.exp(-got.opacities)), alpha, atol=1 / 255 + 1e-6)
    np.testing.assert_allclose(got.sh0, p["sh_dc"].numpy(), atol=0.5 / (0.15 * 255) + 1e-4)
    # rotations: the decoded rotation is the original seen in RUB axes, F R F
    r = quat_to_rotmat(p["quats"]).double().numpy()
    r_got = quat_to_rotmat(torch.from_numpy(np.asarray(got.quats, np.float64))).numpy()
    assert np.abs(r_got - F @ r @ F).max() < 0.02
    # SH: the colour seen along d in the PLY's frame is the colour along F d in the file's
    # Seeded: from the global generator the directions were whatever earlier tests left, and the
    # mean below sits at its bound (0.0276-0.0304 over seeds 0-19, three of them past it), so
    # the verdict hung on the order tests ran in (an xdist worker's differs from a serial run's).
    g = torch.Generator().manual_seed(0)
    dirs = torch.nn.functional.normalize(
        torch.randn(n, 3, dtype=torch.float64, generator=g), dim=-1
    )

    def colour(dc, rest, d):
        basis = sh_reference(d, 4)
        coeffs = torch.cat([torch.as_tensor(dc)[:, None], torch.as_tensor(rest)], 1).double()
        return (basis[:, :, None] * coeffs).sum(1)

    want = colour(p["sh_dc"], p["sh_rest"], dirs)
    seen = colour(got.sh0, got.shN, dirs @ torch.from_numpy(F))
    assert (seen - want).abs().max() < 0.15  # 4-5 bit SH, summed over 15 coefficients
    assert (seen - want).abs().mean() < 0.03


def test_min_opacity_and_far_positions(tmp_path):
    p = gaussians(50, seed=1)
    p["means"][0] = torch.tensor([5000.0, -7000.0, 3.0])  # past 12 fractional bits' +-2048
    data, n = spz_bytes(p, None, min_opacity=0.0)
    bits = header(data)[4]
    assert bits < 12
    np.testing.assert_allclose(read(tmp_path, data).means[0], [5000.0, 7000.0, -3.0], atol=1.0)
    faint = int((torch.sigmoid(p["opacities"]) < 0.5).sum())
    assert spz_bytes(p, None, min_opacity=0.5)[1] == 50 - faint


def test_export_api_spz_of_an_mcmc_antialiased_job(fs_stack, tmp_path):
    centre = np.array([0.3, -0.2, 0.1])
    scene = Scene([Sphere(tuple(centre), 0.6, ((0.9, 0.2, 0.15), (0.2, 0.3, 0.9)), (8, 4))])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in scene_files(32, 16, 1, seed=3, scene=scene).items():
            zf.writestr(name, data)
    config = {
        "steps": 60,
        "n_init_points": 1000,
        "strategy": "mcmc",
        "cap_max": 1100,
        "densify_from": 10,
        "densify_every": 10,
        "antialiased": True,
        "n_test_renders": 0,
    }
    r = fs_stack.submit(buf.getvalue(), "scene.zip", "splat", config, "application/zip")
    assert r.status_code == 202, r.text
    job = fs_stack.wait_status(r.json()["id"], "succeeded", "failed", timeout=240)
    assert job["status"] == "succeeded", f"{job['error']}\n{fs_stack.logs()}"
    m = job["metrics"]
    assert 1000 < m["n_gaussians"] <= 1100 and m["densifications"] >= 2
    state, data = export(fs_stack, job["id"], {"format": "spz"})
    assert state["artifact"].endswith(".spz") and state["stats"]["antialiased"] is True
    assert header(data)[1] == 4 == state["stats"]["version"]  # version 4 unless asked
    _, v3 = export(fs_stack, job["id"], {"format": "spz", "options": {"version": 3}})
    assert header(v3)[1] == 3 and v3[:2] == b"\x1f\x8b"
    np.testing.assert_array_equal(read(tmp_path, v3).means, read(tmp_path, data).means)
    assert (
        header(data)[5] & 1 and header(data)[2] == m["n_gaussians"] == state["stats"]["gaussians"]
    )
    got = read(tmp_path, data)
    # the sphere's centre in RUB axes
    opaque = 1 / (1 + np.exp(-got.opacities)) > 0.3
    assert np.linalg.norm(np.median(got.means[opaque], 0) - centre @ F) < 0.25
    _, ply = export(fs_stack, job["id"], {"format": "gaussians"})
    assert b"comment antialiased 1" in ply[:200] and len(data) < len(ply) / 4
    for options in ({"n_points": 3}, {"version": 2}):
        r = fs_stack.client.post(
            f"/v1/jobs/{job['id']}/exports", json={"format": "spz", "options": options}
        )
        assert r.status_code == 422, (options, r.text)
