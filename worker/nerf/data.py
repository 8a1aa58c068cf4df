"""The dataset's normal form (`dataset/cameras.json` + images) as tensors, and camera rays.

Training pixels of every image are packed into one uint8 array so a batch can draw rays across
all images (mixed sizes included) and build the rays on the fly: memory is the images only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

DISTORTION_KEYS = ("k1", "k2", "k3", "p1", "p2")


@dataclass
class Frame:
    file: str
    c2w: np.ndarray  # 4x4, normalised scene frame, OpenGL axes
    fx: float
    fy: float
    cx: float
    cy: float
    w: int
    h: int
    split: str
    distortion: dict[str, float]


def _frame(d: dict[str, Any]) -> Frame:
    dist = {k: float(v) for k, v in (d.get("distortion") or {}).items() if k in DISTORTION_KEYS and v}
    return Frame(d["file"], np.asarray(d["c2w"], dtype=np.float64), float(d["fx"]), float(d["fy"]), float(d["cx"]),
                 float(d["cy"]), int(d["w"]), int(d["h"]), d.get("split", "train"), dist)


def read_meta(dataset_dir: Path) -> dict[str, Any]:
    return json.loads((Path(dataset_dir) / "cameras.json").read_text())


def load_image(path: Path) -> np.ndarray:
    """uint8 (H, W, 4); images without alpha get an opaque one."""
    with Image.open(path) as im:
        return np.asarray(im.convert("RGBA"), dtype=np.uint8)


def composite_background(rgba: torch.Tensor, background: torch.Tensor) -> torch.Tensor:
    """Straight-alpha RGBA float (..., 4) over a background (3,) or (..., 3)."""
    a = rgba[..., 3:4]
    return rgba[..., :3] * a + background * (1.0 - a)


def background_rgb(spec: Any) -> tuple[float, float, float]:
    if spec in (None, "white"):
        return (1.0, 1.0, 1.0)
    if spec == "black":
        return (0.0, 0.0, 0.0)
    r, g, b = (float(v) for v in spec)
    return (r, g, b)


def undistort(x: torch.Tensor, y: torch.Tensor, dist: dict[str, float], iters: int = 10):
    """Invert OpenCV radial-tangential distortion on normalised image coordinates (fixed point)."""
    k1, k2, k3 = dist.get("k1", 0.0), dist.get("k2", 0.0), dist.get("k3", 0.0)
    p1, p2 = dist.get("p1", 0.0), dist.get("p2", 0.0)
    xu, yu = x.clone(), y.clone()
    for _ in range(iters):
        r2 = xu * xu + yu * yu
        radial = 1 + r2 * (k1 + r2 * (k2 + r2 * k3))
        dx = 2 * p1 * xu * yu + p2 * (r2 + 2 * xu * xu)
        dy = p1 * (r2 + 2 * yu * yu) + 2 * p2 * xu * yu
        xu = (x - dx) / radial
        yu = (y - dy) / radial
    return xu, yu


def pixel_rays(c2w: torch.Tensor, px: torch.Tensor, py: torch.Tensor, fx, fy, cx, cy,
               distortion: dict[str, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit rays through pixel positions (px, py) (pixel centres are at +0.5).

    c2w is (4, 4) or per-ray (N, 4, 4); intrinsics are scalars or (N,) tensors.
    """
    x = (px - cx) / fx
    y = (py - cy) / fy
    if distortion:
        x, y = undistort(x, y, distortion)
    d_cam = torch.stack([x, -y, -torch.ones_like(x)], dim=-1)
    if c2w.dim() == 2:
        d = d_cam @ c2w[:3, :3].T
        o = c2w[:3, 3].expand_as(d)
    else:
        d = torch.einsum("nij,nj->ni", c2w[:, :3, :3], d_cam)
        o = c2w[:, :3, 3]
    d = d / d.norm(dim=-1, keepdim=True)
    return o.contiguous(), d.contiguous()


def image_rays(c2w: torch.Tensor, width: int, height: int, fx, fy, cx, cy, distortion=None):
    """Rays of every pixel, row-major (H*W, 3) each."""
    j, i = torch.meshgrid(torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32),
                          indexing="ij")
    return pixel_rays(c2w.float(), i.reshape(-1) + 0.5, j.reshape(-1) + 0.5, fx, fy, cx, cy, distortion)


class Dataset:
    """Frames of one split with their pixels; `sample(n)` draws random training rays."""

    def __init__(self, dataset_dir: Path, split: str = "train", meta: dict[str, Any] | None = None):
        self.dir = Path(dataset_dir)
        self.meta = meta or read_meta(self.dir)
        self.frames = [_frame(f) for f in self.meta["frames"] if f.get("split", "train") == split]
        if not self.frames:
            raise ValueError(f"the dataset has no {split!r} frames")
        self.images = [load_image(self.dir / f.file) for f in self.frames]
        for f, im in zip(self.frames, self.images):
            if im.shape[:2] != (f.h, f.w):
                raise ValueError(f"{f.file} is {im.shape[1]}x{im.shape[0]}, cameras.json says {f.w}x{f.h}")
        self.has_alpha = bool(self.meta.get("has_alpha")) and any((im[..., 3] < 255).any() for im in self.images)
        self.c2w = torch.tensor(np.stack([f.c2w for f in self.frames]), dtype=torch.float32)
        self.intrinsics = torch.tensor([[f.fx, f.fy, f.cx, f.cy] for f in self.frames], dtype=torch.float32)
        self.widths = torch.tensor([f.w for f in self.frames], dtype=torch.int64)
        counts = torch.tensor([f.w * f.h for f in self.frames], dtype=torch.int64)
        self.starts = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        self.pixels = torch.from_numpy(np.concatenate([im.reshape(-1, 4) for im in self.images]))
        self.distorted = any(f.distortion for f in self.frames)

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def n_pixels(self) -> int:
        return int(self.starts[-1])

    def rays_of(self, idx: torch.Tensor, generator: torch.Generator | None = None):
        """Rays and straight-alpha RGBA targets (float) of global pixel indices."""
        img = torch.searchsorted(self.starts, idx, right=True) - 1
        local = idx - self.starts[img]
        w = self.widths[img]
        py, px = (local // w).float() + 0.5, (local % w).float() + 0.5
        k = self.intrinsics[img]
        if self.distorted:
            # Per-frame coefficients: group by image (rare path, COLMAP/ngp captures).
            o = torch.empty(idx.shape[0], 3)
            d = torch.empty(idx.shape[0], 3)
            for i in img.unique().tolist():
                m = img == i
                f = self.frames[i]
                o[m], d[m] = pixel_rays(self.c2w[i], px[m], py[m], f.fx, f.fy, f.cx, f.cy, f.distortion)
        else:
            o, d = pixel_rays(self.c2w[img], px, py, k[:, 0], k[:, 1], k[:, 2], k[:, 3])
        rgba = self.pixels[idx].float() / 255.0
        return o, d, rgba

    def sample(self, n: int, generator: torch.Generator | None = None):
        idx = torch.randint(0, self.n_pixels, (n,), generator=generator)
        return self.rays_of(idx)

    def frame_rays(self, i: int):
        f = self.frames[i]
        return image_rays(self.c2w[i], f.w, f.h, f.fx, f.fy, f.cx, f.cy, f.distortion or None)

    def frame_rgba(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.images[i]).float() / 255.0


def fov_to_focal(fov_deg: float, size: int) -> float:
    return 0.5 * size / math.tan(math.radians(fov_deg) / 2)
