"""Frames taken through a distorting lens, resampled to pinhole cameras, for renderers that project
pinhole cameras only (the splat rasteriser).

Each distorted frame becomes a pinhole camera with the photo's focal lengths whose image spans the
tangents of the rays through the photo's border (so no photo pixel is cut off), at most
MAX_SCALE times the photo's size per side (COLMAP's undistorter's max_scale; a wide fisheye is
cropped there, and nothing past 90 degrees off axis fits a pinhole image anyway). A pixel of the
new image takes the photo's colour where its ray meets the photo (bilinear, at the forward
distortion of its pinhole coordinates, which needs no iteration); pixels whose ray misses the
photo are masked, so they neither train nor count in held-out scores.
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch
import torch.nn.functional as F

from worker.scene.cameras import distort, fisheye_distort, rays_from_pixels
from worker.scene.dataset import Dataset, Frame

MAX_SCALE = 2.0
BORDER_SAMPLES = 129  # points along each edge of the photo whose rays bound the pinhole image
MIN_FORWARD = 1e-3  # rays this close to 90 degrees off axis have no place in a pinhole image


def pinhole_intrinsics(
    f: Frame, dist: torch.Tensor, fisheye: bool
) -> tuple[float, float, float, float, int, int]:
    """fx, fy, cx, cy, width, height of the pinhole camera that holds frame f's rays.

    Args:
        f: the frame (its fx, fy, cx, cy, w, h).
        dist: (5,) OpenCV k1, k2, k3, p1, p2, or fisheye k1..k4 and a 0.
        fisheye: whether `dist` is the fisheye model.
    """
    t = torch.linspace(0, 1, BORDER_SAMPLES, dtype=torch.float64)
    zero, one = torch.zeros_like(t), torch.ones_like(t)
    u, v = torch.cat([t, t, zero, one]), torch.cat([zero, one, t, t])
    intr = torch.tensor([f.fx, f.fy, f.cx, f.cy])
    fe = torch.full(u.shape, fisheye) if fisheye else None
    _, d = rays_from_pixels(torch.eye(4), intr, u * f.w, v * f.h, dist, fe)
    d = d.double()
    forward = (-d[:, 2]).clamp_min(MIN_FORWARD)  # camera looks down -z
    tx, ty = d[:, 0] / forward, -d[:, 1] / forward  # ty: image down

    def span(lo: float, hi: float, focal: float, size: int) -> tuple[float, int]:
        # Scaled towards the optical axis when wider than MAX_SCALE x the photo.
        s = min(1.0, MAX_SCALE * size / ((hi - lo) * focal))
        lo, hi = lo * s, hi * s
        return -lo * focal, max(1, math.ceil((hi - lo) * focal - 1e-6))

    cx, w = span(float(tx.min()), float(tx.max()), f.fx, f.w)
    cy, h = span(float(ty.min()), float(ty.max()), f.fy, f.h)
    return f.fx, f.fy, cx, cy, w, h


def source_coords(
    f: Frame,
    dist: torch.Tensor,
    fisheye: bool,
    fx: float,
    fy: float,
    cx: float,
    cy: float,
    w: int,
    h: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the ray of each pixel centre of the (w, h) pinhole image meets frame f's photo:
    (h, w) x and y in the photo's pixel coordinates (pixel centres at integer + 0.5)."""
    j, i = torch.meshgrid(
        torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij"
    )
    x, y = (i + 0.5 - cx) / fx, (j + 0.5 - cy) / fy
    d = dist.double()
    xd, yd = fisheye_distort(x, y, d[:4]) if fisheye else distort(x, y, d)
    return f.fx * xd + f.cx, f.fy * yd + f.cy


def resample(
    rgba: torch.Tensor, keep: torch.Tensor | None, px: torch.Tensor, py: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The photo at continuous pixel positions.

    Args:
        rgba: (H, W, 4) uint8 straight-alpha photo.
        keep: (H, W) bool of the photo's training pixels, or None (all).
        px, py: (h, w) positions in the photo's pixel coordinates.

    Returns:
        (h, w, 4) uint8 bilinear samples, and (h, w) bool: inside the photo and on a kept pixel.
    """
    H, W = rgba.shape[:2]
    grid = torch.stack([px / W * 2 - 1, py / H * 2 - 1], -1).float()[None]
    img = rgba.permute(2, 0, 1)[None].float()
    out = F.grid_sample(img, grid, mode="bilinear", padding_mode="border", align_corners=False)
    out = out[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8)
    inside = (px >= 0) & (px <= W) & (py >= 0) & (py <= H)
    if keep is not None:
        k = F.grid_sample(
            keep[None, None].float(),
            grid,
            mode="nearest",
            padding_mode="border",
            align_corners=False,
        )
        inside &= k[0, 0] > 0.5
    return out, inside


def to_pinhole(data: Dataset) -> Dataset:
    """`data` with every distorted or fisheye frame resampled to a pinhole camera (module doc);
    `data` itself when no frame has a lens to undo."""
    if data.distortion is None:
        return data
    frames, images, keeps = [], [], []
    for i, f in enumerate(data.frames):
        rgba = data.pixels[data.starts[i] : data.starts[i + 1]].reshape(f.h, f.w, 4)
        keep = data.frame_mask(i)
        if f.distortion or f.fisheye:
            dist = data.distortion[i]
            fx, fy, cx, cy, w, h = pinhole_intrinsics(f, dist, f.fisheye)
            px, py = source_coords(f, dist, f.fisheye, fx, fy, cx, cy, w, h)
            rgba, keep = resample(rgba, keep, px, py)
            f = dataclasses.replace(f, fx=fx, fy=fy, cx=cx, cy=cy, w=w, h=h, distortion={})
            f.fisheye = False
        frames.append(f)
        images.append(rgba.reshape(-1, 4))
        keeps.append(keep)
    out = copy.copy(data)
    out.frames = frames
    out.intrinsics = torch.tensor([[f.fx, f.fy, f.cx, f.cy] for f in frames], dtype=torch.float32)
    out.widths = torch.tensor([f.w for f in frames], dtype=torch.int64)
    counts = torch.tensor([f.w * f.h for f in frames], dtype=torch.int64)
    out.starts = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
    out.pixels = torch.cat(images)
    out.distortion = out.fisheye = None
    out.set_masks([None if k is None or bool(k.all()) else k.reshape(-1) for k in keeps])
    return out
