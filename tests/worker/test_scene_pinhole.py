"""Distorted and fisheye photos resampled to pinhole cameras (worker.scene.pinhole), and held-out
scores that leave masked pixels out.

The photos are drawn from a pattern defined on ray directions, so each pixel of the pinhole
image has a known right colour: the pattern at that pixel's own ray."""

from __future__ import annotations

import numpy as np
import torch

from core.scene_build import SceneFrame, write_scene
from core.scene_format import FISHEYE
from tests.core.test_scene_build import ring
from worker.scene.cameras import fisheye_directions, rays_from_pixels, undistort
from worker.scene.dataset import Dataset
from worker.scene.evaluate import evaluate
from worker.scene.metrics import psnr
from worker.scene.pinhole import MAX_SCALE, to_pinhole

W, H, FX, FY, CX, CY = 120, 90, 100.0, 104.0, 61.0, 44.0
BARREL = {"k1": -0.3, "k2": 0.08, "p1": 0.003, "p2": -0.002}
FISH = {"k1": 0.04, "k2": -0.01}


def pattern(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(..., 3) colour of the ray through normalised pinhole coordinates (x, y), y down."""
    return np.stack(
        [
            0.5 + 0.4 * np.sin(9 * x + 2 * y),
            0.5 + 0.4 * np.cos(7 * y - 3 * x),
            0.5 + 0.3 * np.sin(5 * (x + y)) * np.cos(4 * x),
        ],
        -1,
    )


def photo(distortion: dict, fisheye: bool) -> np.ndarray:
    """The (H, W, 3) uint8 photo the lens makes of the pattern."""
    j, i = np.meshgrid(np.arange(H) + 0.5, np.arange(W) + 0.5, indexing="ij")
    xd, yd = torch.tensor((i - CX) / FX), torch.tensor((j - CY) / FY)
    if fisheye:
        k = torch.tensor([distortion.get(k, 0.0) for k in ("k1", "k2", "k3", "k4")]).double()
        x, y, z = fisheye_directions(xd, yd, k)
        x, y = x / z, y / z
    else:
        k = torch.tensor([distortion.get(k, 0.0) for k in ("k1", "k2", "k3", "p1", "p2")]).double()
        x, y = undistort(xd, yd, k, iters=50)
    return np.round(pattern(x.numpy(), y.numpy()) * 255).astype(np.uint8)


def scene(tmp_path, mask=None) -> Dataset:
    """Four train frames (pinhole, barrel, fisheye, pinhole) and one barrel test frame."""
    lenses = [({}, False), (BARREL, False), (FISH, True), ({}, False), (BARREL, False)]
    frames = []
    for (dist, fe), c2w, split in zip(lenses, ring(5), ["train"] * 4 + ["test"]):
        f = SceneFrame(photo(dist, fe), c2w, FX, FY, CX, CY, split=split, distortion=dist)
        f.camera_model = FISHEYE if fe else f.camera_model
        f.mask = mask
        frames.append(f)
    write_scene(tmp_path, frames, source_format="test")
    return Dataset(tmp_path, ("train", "test"))


def expected(f) -> np.ndarray:
    """The pattern at each pixel's ray through frame f's pinhole camera."""
    j, i = np.meshgrid(np.arange(f.h) + 0.5, np.arange(f.w) + 0.5, indexing="ij")
    return pattern((i - f.cx) / f.fx, (j - f.cy) / f.fy)


def test_resampled_frames_show_each_pixel_its_own_ray(tmp_path):
    data = scene(tmp_path)
    pin = to_pinhole(data)
    assert pin.distortion is None and pin.fisheye is None
    assert data.distortion is not None  # the input is left as it was
    for i, (before, after) in enumerate(zip(data.frames, pin.frames)):
        got = pin.frame_rgba(i)[..., :3].numpy()
        want = expected(after)
        keep = pin.frame_mask(i)
        if not (before.distortion or before.fisheye):
            assert after == before and keep is None
            assert np.array_equal(pin.frame_rgba(i).numpy(), data.frame_rgba(i).numpy())
            continue
        assert not after.distortion and not after.fisheye
        assert (after.fx, after.fy) == (FX, FY)
        # Barrel and fisheye lenses see more than a pinhole of the same focal length: the
        # pinhole image grows to hold every photo pixel, within MAX_SCALE per side.
        assert W < after.w <= MAX_SCALE * W and H < after.h <= MAX_SCALE * H
        keep = keep.numpy()
        assert 0.5 < keep.mean() < 1.0
        good = psnr(got, want, keep)
        # The same comparison without undoing the lens: the photo is far from the pinhole view.
        raw = psnr(data.frame_rgba(i)[..., :3].numpy(), expected(before))
        assert good > 35 and raw < good - 10, (good, raw)


def test_rays_of_the_pinhole_pixels_are_the_photos_rays(tmp_path):
    data = scene(tmp_path)
    pin = to_pinhole(data)
    from worker.scene.pinhole import source_coords

    for i in (1, 2):
        f, p = data.frames[i], pin.frames[i]
        px, py = source_coords(f, data.distortion[i], f.fisheye, p.fx, p.fy, p.cx, p.cy, p.w, p.h)
        keep = pin.frame_mask(i).reshape(-1)
        _, d_pin = pin.frame_rays(i)
        fe = None if data.fisheye is None else data.fisheye[i].expand(int(keep.sum()))
        _, d_photo = rays_from_pixels(
            data.c2w[i],
            data.intrinsics[i],
            px.reshape(-1)[keep].float(),
            py.reshape(-1)[keep].float(),
            data.distortion[i],
            fe,
        )
        torch.testing.assert_close(d_pin[keep], d_photo, atol=2e-4, rtol=0)
        # Every photo pixel has its place: the kept sources reach the photo's four edges.
        xs, ys = px.reshape(-1)[keep], py.reshape(-1)[keep]
        assert xs.min() < 1 and xs.max() > W - 1 and ys.min() < 1 and ys.max() > H - 1


def test_an_uploaded_mask_stays_with_its_pixels(tmp_path):
    mask = np.full((H, W), 255, np.uint8)
    mask[:, : W // 2] = 0  # the left half never trains
    data = scene(tmp_path, mask)
    pin = to_pinhole(data)
    for i, f in enumerate(pin.frames):
        keep = pin.frame_mask(i).numpy()
        j, u = np.meshgrid(np.arange(f.h) + 0.5, np.arange(f.w) + 0.5, indexing="ij")
        x = (u - f.cx) / f.fx
        # Kept pixels look right of the photo's centre column (barrel and fisheye lenses bend
        # lines, not sides); some are kept.
        assert keep.any() and (x[keep] > (W // 2 - CX - 1.5) / FX).all()
        assert pin.keep_share < 0.5


def test_held_out_scores_leave_masked_pixels_out(tmp_path):
    mask = np.full((H, W), 255, np.uint8)
    mask[:20] = 0
    scene(tmp_path, mask)
    test = Dataset(tmp_path, "test")
    assert test.frame_mask(0) is not None
    bg = torch.ones(3)
    truth = test.frame_rgba(0)[..., :3].numpy()

    def render(_):
        # Right wherever the mask keeps, black where it does not.
        out = truth.copy()
        out[:20] = 0
        return out, None

    masked, _ = evaluate(render, test, bg)
    test.set_masks([None])  # the same render scored over every pixel
    whole, _ = evaluate(render, test, bg)
    # SSIM's windows reach a few rows into the masked band: near 1, not 1.
    assert masked["test_psnr"] == 100.0 and masked["test_ssim"] > 0.95, masked
    assert whole["test_psnr"] < 20 and whole["test_ssim"] < masked["test_ssim"] - 0.1, whole


def test_a_view_whose_mask_keeps_nothing_has_no_score(tmp_path):
    # Uploads cannot mask out a whole photo (intake refuses it); masks set on a loaded dataset
    # (resampled views) could.
    scene(tmp_path)
    test = Dataset(tmp_path, "test")
    test.set_masks([torch.zeros(H * W, dtype=torch.bool)])
    truth = test.frame_rgba(0)[..., :3].numpy()
    views = []
    metrics, _ = evaluate(lambda _: (truth, None), test, torch.ones(3), on_view=views.append)
    assert "test_psnr" not in metrics and metrics["n_test"] == 1
    assert views[0].scores == {}
