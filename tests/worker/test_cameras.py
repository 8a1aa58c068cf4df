"""Camera math (worker/scene/cameras.py), request cameras (worker/scene/requests.py) and their
schemas, and the dataset loader (worker/scene/dataset.py)."""

from __future__ import annotations

import io
import math
import zipfile

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from api_schemas.camera import Camera, Orbit
from api_schemas.render import Intrinsics
from core.settings import Settings
from experiments import synthetic_scene as S
from service.intake.nerf import validate_upload
from worker.scene import cameras as C
from worker.scene import requests as R
from worker.scene.dataset import Dataset, composite_background

RNG = np.random.default_rng(7)


def random_camera():
    eye = RNG.normal(size=3) * 3
    target = RNG.normal(size=3) * 0.3
    return C.look_at(eye, target, (0.0, 0.0, 1.0)), eye, target


def pinhole_project(p_world, c2w, fx, fy, cx, cy):
    """Independent projection: invert the pose with numpy, OpenGL -> pixel (rows go down)."""
    w2c = np.linalg.inv(np.asarray(c2w, dtype=np.float64))
    x, y, z = w2c[:3, :3] @ p_world + w2c[:3, 3]
    assert z < 0, "point is behind the camera"
    return cx + fx * x / -z, cy - fy * y / -z


def test_ray_through_a_pixel_centre_hits_the_point_that_projects_there():
    for _ in range(5):
        c2w, _, _ = random_camera()
        w, h, fx, fy, cx, cy = 40, 30, 35.0, 33.0, 19.3, 15.8
        o, d = C.image_rays(c2w, fx, fy, cx, cy, w, h)
        for i, j in [(0, 0), (39, 29), (7, 22)]:
            k = j * w + i  # row-major, top-left first
            p = (o[k] + 2.7 * d[k]).double().numpy()
            u, v = pinhole_project(p, c2w, fx, fy, cx, cy)
            assert (u, v) == pytest.approx((i + 0.5, j + 0.5), abs=1e-4)
        assert torch.allclose(d.norm(dim=1), torch.ones(w * h), atol=1e-6)


def test_look_at_orientation():
    eye, target, up = (
        np.array([2.0, -3.0, 1.5]),
        np.array([0.2, 0.1, -0.3]),
        np.array([0.0, 0.0, 1.0]),
    )
    c2w = C.look_at(eye, target, up)
    r = c2w[:3, :3].numpy()
    np.testing.assert_allclose(r.T @ r, np.eye(3), atol=1e-12)
    assert np.linalg.det(r) == pytest.approx(1.0)
    w = h = 31  # odd: a pixel centre sits on the axis
    f = C.focal_from_fov(50, w)
    o, d = C.image_rays(c2w, f, f, w / 2, h / 2, w, h)
    centre = d[(h // 2) * w + w // 2].double().numpy()
    np.testing.assert_allclose(centre, (target - eye) / np.linalg.norm(target - eye), atol=1e-6)
    # World up appears up in the image (smaller row), the right of the view on the right.
    fwd = (target - eye) / np.linalg.norm(target - eye)
    right = np.cross(fwd, up)
    u, v = pinhole_project(target + 0.2 * up, c2w, f, f, w / 2, h / 2)
    assert v < h / 2 and u == pytest.approx(w / 2, abs=1e-9)
    u, v = pinhole_project(target + 0.2 * right, c2w, f, f, w / 2, h / 2)
    assert u > w / 2 and v == pytest.approx(h / 2, abs=1e-9)
    # The generator's numpy look_at agrees with the torch one.
    np.testing.assert_allclose(S.look_at(eye, target, up), c2w.numpy(), atol=1e-12)


def test_look_at_refuses_degenerate_views():
    with pytest.raises(ValueError):
        C.look_at((1, 1, 1), (1, 1, 1))
    with pytest.raises(ValueError):
        C.look_at((0, 0, 3), (0, 0, 0), (0, 0, 1))


def test_normalisation_round_trip_and_projection_invariance():
    norm = {"scale": 0.37, "offset": [1.5, -2.0, 0.25]}
    c2w, _, _ = random_camera()
    back = C.denormalize_pose(C.normalize_pose(c2w, norm), norm)
    assert torch.allclose(back, c2w, atol=1e-12)
    p = RNG.normal(size=(6, 3)) * 0.3
    pn = C.normalize_points(p, norm)
    np.testing.assert_allclose(pn.numpy() / norm["scale"] + norm["offset"], p, atol=1e-12)
    cn = C.normalize_pose(c2w, norm)
    for a, b in zip(p, pn.numpy()):
        assert pinhole_project(a, c2w, 30, 30, 16, 16) == pytest.approx(
            pinhole_project(b, cn, 30, 30, 16, 16)
        )
    # 3x4 in, 4x4 out
    assert C.normalize_pose(c2w[:3], norm).shape == (4, 4)


def test_distortion_inverse():
    dist = torch.tensor([0.05, -0.01, 0.002, 0.001, -0.0007], dtype=torch.float64)
    x = torch.linspace(-0.6, 0.6, 25, dtype=torch.float64)
    y = torch.linspace(0.5, -0.4, 25, dtype=torch.float64)
    xd, yd = C.distort(x, y, dist)
    assert (xd - x).abs().max() > 1e-3  # the distortion does something
    xu, yu = C.undistort(xd, yd, dist)
    assert torch.allclose(xu, x, atol=1e-7) and torch.allclose(yu, y, atol=1e-7)
    # A distorted pixel's ray, projected back through the distortion, lands on that pixel.
    fx, fy, cx, cy = 40.0, 42.0, 20.0, 18.0
    c2w = torch.eye(4)
    px, py = torch.tensor([3.5, 30.5, 20.5]), torch.tensor([2.5, 33.5, 10.5])
    _, d = C.rays_from_pixels(
        c2w.expand(3, 4, 4),
        torch.tensor([fx, fy, cx, cy]).expand(3, 4),
        px,
        py,
        dist.float().expand(3, 5),
    )
    xn, yn = d[:, 0] / -d[:, 2], -d[:, 1] / -d[:, 2]
    xd, yd = C.distort(xn.double(), yn.double(), dist)
    assert torch.allclose(fx * xd + cx, px.double(), atol=1e-3)
    assert torch.allclose(fy * yd + cy, py.double(), atol=1e-3)


def test_orbit_poses():
    centre, up = np.array([0.3, -0.2, 0.1]), np.array([0.0, 1.0, 0.0])
    poses = C.orbit_poses(centre, 2.5, 30.0, 12, up)
    assert poses.shape == (12, 4, 4)
    eyes = poses[:, :3, 3].numpy()
    np.testing.assert_allclose(np.linalg.norm(eyes - centre, axis=1), 2.5, atol=1e-9)
    elev = np.degrees(np.arcsin((eyes - centre) @ up / 2.5))
    np.testing.assert_allclose(elev, 30.0, atol=1e-9)
    for m in poses:
        u, v = pinhole_project(centre, m, 20, 20, 10, 10)
        assert (u, v) == pytest.approx((10, 10), abs=1e-9)
    az = np.arctan2(*(eyes - centre)[:, [0, 2]].T[::-1])
    steps = np.diff(np.unwrap(az))
    np.testing.assert_allclose(np.abs(steps), 2 * math.pi / 12, atol=1e-9)


def test_request_camera_schema_refuses_degenerate_cameras():
    base = {"width": 8, "height": 8}
    eye = {"look_at": {"eye": [0, 0, 3], "target": [0, 0, 0]}}
    for bad in [
        {**base, "look_at": {"eye": [1, 2, 3], "target": [1, 2, 3]}},
        {**base, "look_at": {"eye": [0, 0, 3], "target": [0, 0, 0], "up": [0, 0, 5]}},
        {**base, **eye, "fov_x_deg": 0},
        {**base, **eye, "fov_y_deg": 180},
        {**base, **eye, "fx": -2},
        {**eye, "width": 0, "height": 8},
        {**eye, "width": 8},
        {**base, "c2w": [[2, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]},
        {**base, "c2w": [[1, 0, 0], [0, 1, 0]]},
        {**base, "c2w": [[-1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]},
        {**base},
        {**base, **eye, "c2w": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]},
        {**base, **eye, "fov_x_deg": 40, "fx": 10},
    ]:
        with pytest.raises(ValidationError):
            Camera.model_validate(bad)
    with pytest.raises(ValidationError):
        Camera.model_validate_json(
            '{"width": 8, "height": 8, "c2w": [[NaN,0,0,0],[0,1,0,0],[0,0,1,0]]}'
        )
    with pytest.raises(ValidationError):
        Orbit.model_validate({"radius": 0})
    with pytest.raises(ValidationError):
        Orbit.model_validate({"radius": 1, "elevation_deg": 90})
    ok = Camera.model_validate({**base, **eye, "fov_y_deg": 30})
    assert ok.look_at.up is None


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """The synthetic scene through the real intake: (dataset dir, cameras.json)."""
    tmp = tmp_path_factory.mktemp("ds")
    job = tmp / "job"
    (job / "upload").mkdir(parents=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in S.scene_files(size=24, n_train=10, n_test=3, seed=1).items():
            zf.writestr(name, data)
    (job / "upload" / "s.zip").write_bytes(buf.getvalue())
    validate_upload(job / "upload" / "s.zip", "s.zip", {}, job, Settings(data_dir=tmp))
    return job / "dataset"


def test_resolve_request_camera_against_a_dataset(dataset):
    ds = Dataset(dataset, "test")
    meta = ds.meta
    world = C.denormalize_pose(ds.c2w[0].double(), ds.normalization)
    cam = Camera.model_validate({"c2w": world.tolist(), "width": 24, "height": 24})
    rc = R.resolve_camera(cam, cam, cam.width, cam.height, meta)
    assert torch.allclose(rc.c2w, ds.c2w[0].double(), atol=1e-5)
    assert rc.fx == pytest.approx(ds.frames[0].fx)  # default: the dataset's fov
    eye = world[:3, 3].tolist()
    cam = Camera.model_validate(
        {"look_at": {"eye": eye, "target": [0, 0, 0]}, "fov_x_deg": 90, "width": 10, "height": 6}
    )
    la = R.resolve_camera(cam, cam, cam.width, cam.height, meta)
    assert la.fx == pytest.approx(5.0) and (la.cx, la.cy) == (5.0, 3.0)
    assert torch.allclose(la.c2w[:3, 3], C.normalize_points(eye, ds.normalization), atol=1e-9)
    path = R.orbit_cameras(Orbit(radius=3.0, n_frames=4), Intrinsics(fov_y_deg=60), 8, 8, meta)
    assert len(path) == 4 and path[0].fy == pytest.approx(C.focal_from_fov(60, 8))


def test_dataset_rays_reproduce_the_ground_truth(dataset):
    """Intake + normalisation + rays: tracing the exact scene along a dataset's rays gives its photo."""
    ds = Dataset(dataset, "train")
    assert len(ds) == 10 and ds.pixels.shape == (10 * 24 * 24, 4) and ds.has_alpha
    s, off = ds.normalization["scale"], np.array(ds.normalization["offset"])
    for k in (0, 4):
        o, d = ds.frame_rays(k)
        rgb, a, _ = S.trace(S.default_scene(), o.double().numpy() / s + off, d.double().numpy())
        img = ds.frame_rgba(k).reshape(-1, 4).numpy()
        assert np.abs(img[:, 3] - a).max() < 1e-6
        hit = a > 0
        assert hit.sum() > 20
        assert np.abs(img[hit, :3] - rgb[hit]).max() <= 0.5 / 255 + 1e-6


def test_sampled_rays_are_the_rays_of_their_pixels(dataset):
    ds = Dataset(dataset, ("train", "test"))
    assert len(ds) == 13
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, ds.n_pixels, (4000,), generator=g)
    o, d, rgba = ds.rays_of(idx)
    img = torch.searchsorted(ds.starts, idx, right=True) - 1
    assert set(img.tolist()) == set(range(len(ds)))
    for n in range(0, 4000, 997):
        k, p = int(img[n]), int(idx[n] - ds.starts[img[n]])
        fo, fd = ds.frame_rays(k)
        assert torch.allclose(d[n], fd[p], atol=1e-6) and torch.allclose(o[n], fo[p])
        assert torch.equal(rgba[n], ds.frame_rgba(k).reshape(-1, 4)[p])
    black = composite_background(rgba, torch.zeros(3))
    assert torch.allclose(black, rgba[:, :3] * rgba[:, 3:])
    empty = rgba[:, 3] == 0
    assert empty.any()
    assert torch.allclose(composite_background(rgba, torch.ones(3))[empty], torch.ones(1))


def test_jittered_rays_pass_through_their_own_pixel(dataset):
    # Training rays through random points of a pixel (pixel_jitter): projected back into their
    # camera each lands inside the pixel whose colour it carries, spread over the pixel's area.
    ds = Dataset(dataset, "train")
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, ds.n_pixels, (2000,), generator=g)
    at = torch.rand(2000, 2, generator=g)
    o, d, rgba = ds.rays_of(idx, at)
    _, _, centre_rgba = ds.rays_of(idx)
    assert torch.equal(rgba, centre_rgba)
    img = torch.searchsorted(ds.starts, idx, right=True) - 1
    frac = []
    for n in range(0, 2000, 40):
        k, p = int(img[n]), int(idx[n] - ds.starts[img[n]])
        w = ds.frames[k].w
        fx, fy, cx, cy = ds.intrinsics[k].tolist()
        u, v = pinhole_project((o[n] + 2.0 * d[n]).double().numpy(), ds.c2w[k], fx, fy, cx, cy)
        assert (u, v) == pytest.approx(
            (p % w + float(at[n, 0]), p // w + float(at[n, 1])), abs=1e-3
        )
        frac.append((u - p % w, v - p // w))
    frac = np.array(frac)
    assert frac.min() < 0.15 and frac.max() > 0.85  # the whole pixel, not its centre
    # sample() draws the points itself, within a square `jitter` pixels wide around the centre;
    # without jitter its rays are the centres'.
    o0, d0, _ = ds.sample(500, torch.Generator().manual_seed(4))
    for width in (1.0, 0.5):
        o1, d1, _ = ds.sample(500, torch.Generator().manual_seed(4), jitter=width)
        assert torch.equal(o1, o0) and not torch.allclose(d1, d0, atol=1e-4)
        # Off the centre ray by at most half the square's diagonal, in pixels (fx ~ fy here).
        angle = torch.acos((d1 * d0).sum(1).clamp(max=1.0))
        assert angle.max() * float(ds.intrinsics[:, 0].min()) < width * 0.75
        assert angle.max() * float(ds.intrinsics[:, 0].max()) > width * 0.35


def test_wire_render_requests_resolve(dataset):
    """The API's request types (api_schemas.render), as the task hands them on, resolve here."""
    from api_schemas.render import PathRequest, RenderRequest

    ds = Dataset(dataset, "test")
    world = C.denormalize_pose(ds.c2w[1].double(), ds.normalization)
    req = RenderRequest.model_validate(
        {"width": 24, "height": 24, "fov_x_deg": 45, "camera": {"c2w": world[:3].tolist()}}
    )
    rc = R.resolve_request_camera(req, ds.meta)
    assert torch.allclose(rc.c2w, ds.c2w[1].double(), atol=1e-5) and rc.fx == pytest.approx(
        C.focal_from_fov(45, 24)
    )
    path = PathRequest.model_validate(
        {"width": 16, "height": 12, "orbit": {"radius": 3.0, "n_frames": 5, "up": [0, 0, 1]}}
    )
    cams = R.path_cameras(path, ds.meta)
    assert len(cams) == 5 and all((c.width, c.height) == (16, 12) for c in cams)
    eyes = torch.stack([c.c2w[:3, 3] for c in cams]) / ds.normalization["scale"]
    assert torch.allclose(eyes.norm(dim=1), torch.full((5,), 3.0, dtype=torch.float64), atol=1e-6)
    poses = PathRequest.model_validate(
        {
            "width": 8,
            "height": 8,
            "poses": [
                {"look_at": {"eye": [3, 0, 1], "target": [0, 0, 0], "up": [0, 0, 1]}},
                {"c2w": world.tolist()},
            ],
        }
    )
    assert len(R.path_cameras(poses, ds.meta)) == 2


def test_nerfstudio_default_frame_is_centred_upright_and_unit():
    """nerfstudio's default dataparser frame (orientation "up", centre "poses", auto scale): the
    mean camera position at the origin, the mean camera up along +z, the largest coordinate 1."""
    poses = np.stack([np.asarray(random_camera()[0]) for _ in range(12)])
    poses[:, :3, 3] += np.array([5.0, -2.0, 7.0])
    t, s = R.nerfstudio_transform(poses)
    m = np.vstack([t, [0, 0, 0, 1]])
    ns = m @ poses
    ns[:, :3, 3] *= s
    np.testing.assert_allclose(ns[:, :3, 3].mean(axis=0), 0, atol=1e-12)
    up = ns[:, :3, 1].mean(axis=0)
    np.testing.assert_allclose(up / np.linalg.norm(up), [0, 0, 1], atol=1e-9)
    assert np.abs(ns[:, :3, 3]).max() == pytest.approx(1.0)
    np.testing.assert_allclose(t[:, :3] @ t[:, :3].T, np.eye(3), atol=1e-12)
