"""The worker's side of masks and fisheye cameras in the normal form: masked pixels are never
sampled for training, and fisheye pixels map back to the rays that made them."""

from __future__ import annotations

import math

import numpy as np
import torch

from core.scene_build import SceneFrame, write_scene
from core.scene_format import FISHEYE
from tests.core.test_scene_build import ring
from worker.scene.cameras import (
    fisheye_directions,
    fisheye_distort,
    image_rays,
    rays_from_pixels,
)
from worker.scene.dataset import Dataset

K = torch.tensor([0.08, -0.02, 0.004, -0.0007])


def test_fisheye_pixels_round_trip_to_their_rays():
    # Directions up to 95 degrees off axis (past what a pinhole can show), in camera axes.
    g = torch.Generator().manual_seed(0)
    theta = torch.rand(2000, generator=g, dtype=torch.float64) * math.radians(95)
    phi = torch.rand(2000, generator=g, dtype=torch.float64) * 2 * math.pi
    d = torch.stack([theta.sin() * phi.cos(), theta.sin() * phi.sin(), theta.cos()], -1)
    # Forward model on theta directly (x/z breaks down past 90 degrees): r_d = theta_d.
    k1, k2, k3, k4 = K.double()
    t2 = theta * theta
    theta_d = theta * (1 + t2 * (k1 + t2 * (k2 + t2 * (k3 + t2 * k4))))
    xd, yd = theta_d * phi.cos(), theta_d * phi.sin()
    x, y, z = fisheye_directions(xd, yd, K.double().expand(2000, 4))
    torch.testing.assert_close(torch.stack([x, y, z], -1), d, atol=1e-9, rtol=0)
    # fisheye_distort agrees with the theta form in front of the camera.
    front = theta < math.radians(80)
    xf, yf = fisheye_distort(d[front, 0] / d[front, 2], d[front, 1] / d[front, 2], K.double())
    torch.testing.assert_close(xf, xd[front]) and torch.testing.assert_close(yf, yd[front])
    # Through pixels: rays_from_pixels with the fisheye flag gives the same directions (OpenGL
    # axes: y up, looking down -z), and without it something else.
    fx, fy, cx, cy = 300.0, 310.0, 320.0, 240.0
    px, py = (cx + fx * xd).float(), (cy + fy * yd).float()
    intr = torch.tensor([fx, fy, cx, cy]).expand(2000, 4)
    dist = torch.cat([K, torch.zeros(1)]).expand(2000, 5)
    c2w = torch.eye(4).expand(2000, 4, 4)
    _, got = rays_from_pixels(c2w, intr, px, py, dist, torch.ones(2000, dtype=torch.bool))
    want = (d * torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64)).float()
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    mixed = torch.arange(2000) % 2 == 0
    _, got_mixed = rays_from_pixels(c2w, intr, px, py, dist, mixed)
    torch.testing.assert_close(got_mixed[mixed], want[mixed], atol=2e-5, rtol=0)
    assert not torch.allclose(got_mixed[~mixed], want[~mixed], atol=1e-2)


def test_masked_pixels_are_never_sampled(tmp_path):
    # Every left half is green. Masked frames: right half red and masked out; the others: right
    # half blue and kept. A red sample is a masked pixel that trained.
    mask = np.zeros((30, 40), np.uint8)
    mask[:, :20] = 255
    frames = []
    for k, c2w in enumerate(ring(9)):
        img = np.zeros((30, 40, 3), np.uint8)
        img[:, :20, 1] = 255
        img[:, 20:, 0 if k % 3 else 2] = 255
        frames.append(SceneFrame(img, c2w, 30.0, 30.0, 20.0, 15.0, mask=mask if k % 3 else None))
    frames[4].camera_model, frames[4].distortion = FISHEYE, {"k1": 0.05}
    write_scene(tmp_path, frames, source_format="test")
    data = Dataset(tmp_path, "train")
    n_masked = sum(bool(f.mask) for f in data.frames)
    assert 0 < n_masked < len(data)
    _, _, rgba = data.sample(20000, torch.Generator().manual_seed(1))
    assert len(rgba) == 20000
    assert int((rgba[:, 0] > 0.5).sum()) == 0
    blue = float((rgba[:, 2] > 0.5).float().mean())
    kept = data.n_pixels - n_masked * 600
    assert abs(blue - (len(data) - n_masked) * 600 / kept) < 0.02
    assert int(data.frame_mask(next(i for i, f in enumerate(data.frames) if f.mask)).sum()) == 600
    # The fisheye frame's rays are finite and differ from the pinhole ones.
    i = int(data.fisheye.nonzero()[0])
    o, d = data.frame_rays(i)
    assert torch.isfinite(d).all()
    pinhole = Dataset(tmp_path, "train")
    pinhole.frames[i].fisheye = False
    assert not torch.allclose(pinhole.frame_rays(i)[1], d, atol=1e-3)


def test_pinhole_views_hold_every_ray_of_distorted_and_fisheye_frames(tmp_path):
    frames = [
        SceneFrame(np.zeros((30, 40, 3), np.uint8), c2w, 30.0, 32.0, 19.0, 16.0, split=split)
        for c2w, split in zip(ring(5), ["train"] * 4 + ["test"])
    ]
    frames[1].distortion = {"k1": -0.25, "k2": 0.05, "p1": 0.004}  # barrel: wider than pinhole
    frames[2].camera_model, frames[2].distortion = FISHEYE, {"k1": 0.05, "k2": -0.01}
    frames[3].camera_model = FISHEYE  # equidistant, no coefficients
    write_scene(tmp_path, frames, source_format="test")
    data = Dataset(tmp_path, "train")
    intr, sizes = data.pinhole_views()
    assert torch.equal(intr[0], data.intrinsics[0]) and sizes[0].tolist() == [40.0, 30.0]
    for i in (1, 2, 3):
        o, d = data.frame_rays(i)
        # Camera axes (OpenGL), then the pinhole pixel each ray passes through.
        cam = d @ data.c2w[i, :3, :3]
        depth = -cam[:, 2]
        fx, fy, cx, cy = intr[i].tolist()
        u, v = cx + fx * cam[:, 0] / depth, cy - fy * cam[:, 1] / depth
        w, h = sizes[i].tolist()
        assert (u >= -1e-3).all() and (u <= w + 1e-3).all()
        assert (v >= -1e-3).all() and (v <= h + 1e-3).all()
        # Tight: the rays through the outermost pixel centres (half a pixel from the edge, more
        # where the lens stretches) come within two pixels of each edge.
        assert u.min() < 2 and u.max() > w - 2 and v.min() < 2 and v.max() > h - 2
        assert (w, h) != (40.0, 30.0)
    # A fisheye that sees past 90 degrees off its axis has no pinhole view.
    frames[2].fx = frames[2].fy = 8.0
    write_scene(tmp_path / "wide", frames, source_format="test")
    assert Dataset(tmp_path / "wide", "train").pinhole_views() is None


def test_fisheye_without_coefficients_is_equidistant_not_pinhole(tmp_path):
    # No frame has distortion coefficients, one is a fisheye: its rays still follow r = f * theta.
    frames = [
        SceneFrame(np.zeros((30, 40, 3), np.uint8), c2w, 20.0, 20.0, 20.0, 15.0, split=split)
        for c2w, split in zip(ring(4), ["train"] * 3 + ["test"])
    ]
    frames[1].camera_model = FISHEYE
    write_scene(tmp_path, frames, source_format="test")
    data = Dataset(tmp_path, "train")
    assert data.fisheye is not None and data.distortion is not None
    o, d = data.frame_rays(1)
    cam = d @ data.c2w[1, :3, :3]  # OpenGL camera axes
    theta = torch.acos((-cam[:, 2]).clamp(-1, 1))
    px, py = pixel_grid_centres(40, 30)
    r = torch.hypot(px - 20.0, py - 15.0)
    torch.testing.assert_close(theta, r / 20.0, atol=1e-4, rtol=0)
    # The same through image_rays for a render camera flagged fisheye.
    _, d2 = image_rays(data.c2w[1], 20.0, 20.0, 20.0, 15.0, 40, 30, fisheye=True)
    torch.testing.assert_close(d2, d, atol=1e-5, rtol=0)


def pixel_grid_centres(w, h):
    j, i = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    return i.reshape(-1).float(), j.reshape(-1).float()
