"""The dataset's normal form (`dataset/cameras.json` + images) for training and evaluation.

Pixels of every image of a split are packed into one uint8 (P, 4) straight-alpha RGBA array (a
quarter of a float32 copy, which matters for large captures), so a batch draws rays uniformly
across all images (mixed sizes included) and builds them on the fly with worker.scene.cameras'
ray math: memory is the images only. Photos without alpha get an opaque one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from core.scene_format import CAMERAS_FILE, DISTORTION_KEYS, FISHEYE, FISHEYE_KEYS
from worker.scene.cameras import image_rays, rays_from_pixels


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
    source: str | None = None  # the photo's name in the upload
    fisheye: bool = False  # `distortion` holds OPENCV_FISHEYE's k1..k4
    mask: str | None = None  # 8-bit PNG, 0 = never trains


def _frame(d: dict[str, Any]) -> Frame:
    fisheye = d.get("camera_model") == FISHEYE
    keys = FISHEYE_KEYS if fisheye else DISTORTION_KEYS
    dist = {k: float(v) for k, v in (d.get("distortion") or {}).items() if k in keys and v}
    return Frame(
        d["file"],
        np.asarray(d["c2w"], dtype=np.float64),
        float(d["fx"]),
        float(d["fy"]),
        float(d["cx"]),
        float(d["cy"]),
        int(d["w"]),
        int(d["h"]),
        d.get("split", "train"),
        dist,
        d.get("source"),
        fisheye,
        d.get("mask"),
    )


def read_meta(dataset_dir: Path) -> dict[str, Any]:
    return json.loads((Path(dataset_dir) / CAMERAS_FILE).read_text())


def load_image(path: Path) -> np.ndarray:
    """uint8 (H, W, 4); images without alpha get an opaque one."""
    with Image.open(path) as im:
        return np.asarray(im.convert("RGBA"), dtype=np.uint8)


def background_rgb(spec: Any) -> tuple[float, float, float]:
    if spec in (None, "white"):
        return (1.0, 1.0, 1.0)
    if spec == "black":
        return (0.0, 0.0, 0.0)
    r, g, b = (float(v) for v in spec)
    return (r, g, b)


def composite_background(rgba: torch.Tensor, background: torch.Tensor) -> torch.Tensor:
    """Straight-alpha RGBA (..., 4) over a background (..., 3) -> RGB."""
    a = rgba[..., 3:4]
    return rgba[..., :3] * a + background * (1 - a)


class Dataset:
    """Frames of one split (or several) with their pixels; `sample(n)` draws random training rays."""

    def __init__(
        self,
        dataset_dir: Path,
        split: str | Iterable[str] = "train",
        meta: dict[str, Any] | None = None,
    ):
        self.dir = Path(dataset_dir)
        self.meta = meta or read_meta(self.dir)
        splits = {split} if isinstance(split, str) else set(split)
        self.frames = [_frame(f) for f in self.meta["frames"] if f.get("split", "train") in splits]
        if not self.frames:
            raise ValueError(f"the dataset has no {'/'.join(sorted(splits))!r} frames")
        images = [load_image(self.dir / f.file) for f in self.frames]
        for f, im in zip(self.frames, images):
            if im.shape[:2] != (f.h, f.w):
                raise ValueError(
                    f"{f.file} is {im.shape[1]}x{im.shape[0]}, cameras.json says {f.w}x{f.h}"
                )
        self.has_alpha = bool(self.meta.get("has_alpha")) and any(
            (im[..., 3] < 255).any() for im in images
        )
        self.c2w = torch.tensor(np.stack([f.c2w for f in self.frames]), dtype=torch.float32)
        self.intrinsics = torch.tensor(
            [[f.fx, f.fy, f.cx, f.cy] for f in self.frames], dtype=torch.float32
        )
        self.widths = torch.tensor([f.w for f in self.frames], dtype=torch.int64)
        counts = torch.tensor([f.w * f.h for f in self.frames], dtype=torch.int64)
        self.starts = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        self.pixels = torch.from_numpy(np.concatenate([im.reshape(-1, 4) for im in images]))
        self.distortion = (
            torch.tensor(
                [
                    [
                        f.distortion.get(k, 0.0)
                        for k in (FISHEYE_KEYS if f.fisheye else DISTORTION_KEYS)
                    ]
                    + [0.0] * f.fisheye
                    for f in self.frames
                ],
                dtype=torch.float32,
            )
            # A fisheye lens with all-zero coefficients is still no pinhole (r = f * theta).
            if any(f.distortion or f.fisheye for f in self.frames)
            else None
        )
        fisheye = torch.tensor([f.fisheye for f in self.frames])
        self.fisheye = fisheye if bool(fisheye.any()) else None
        self.set_masks(
            [torch.from_numpy(self._mask(f).reshape(-1)) if f.mask else None for f in self.frames]
        )

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def normalization(self) -> dict[str, Any]:
        return self.meta["normalization"]

    @property
    def n_pixels(self) -> int:
        return int(self.starts[-1])

    def rays_of(self, idx: torch.Tensor, at: torch.Tensor | None = None):
        """Origins (n, 3), unit directions (n, 3) and straight-alpha RGBA targets (n, 4) float of
        global pixel indices idx (n,), through the pixel centres or the points `at` (n, 2) (x, y
        within the pixel, in [0, 1))."""
        img = torch.searchsorted(self.starts, idx, right=True) - 1
        local = idx - self.starts[img]
        w = self.widths[img]
        py, px = (local // w).float(), (local % w).float()
        if at is None:
            px, py = px + 0.5, py + 0.5
        else:
            px, py = px + at[:, 0], py + at[:, 1]
        dist = None if self.distortion is None else self.distortion[img]
        fe = None if self.fisheye is None else self.fisheye[img]
        o, d = rays_from_pixels(self.c2w[img], self.intrinsics[img], px, py, dist, fe)
        rgba = self.pixels[idx].float() / 255.0
        return o, d, rgba

    def set_masks(self, masks: list[torch.Tensor | None]) -> None:
        """Per frame, (h * w,) bool of the pixels that train, or None for all of them. Masked
        pixels are never drawn by `sample` (nerfstudio's mask_path, ngp's dynamic masks) and do
        not count in held-out scores."""
        self._masked = [m is not None for m in masks]
        self.keep = (
            torch.cat(
                [
                    torch.ones(f.w * f.h, dtype=torch.bool) if m is None else m.to(torch.bool)
                    for f, m in zip(self.frames, masks)
                ]
            )
            if any(self._masked)
            else None
        )
        self.keep_share = 1.0 if self.keep is None else float(self.keep.float().mean())

    def _mask(self, f: Frame) -> np.ndarray:
        """(H, W) bool: the pixels of frame f that train."""
        if not f.mask:
            return np.ones((f.h, f.w), bool)
        with Image.open(self.dir / f.mask) as im:
            m = np.asarray(im.convert("L")) > 0
        if m.shape != (f.h, f.w):
            raise ValueError(
                f"{f.mask} is {m.shape[1]}x{m.shape[0]}, cameras.json says {f.w}x{f.h}"
            )
        return m

    def frame_mask(self, i: int) -> torch.Tensor | None:
        """(H, W) bool of frame i's training pixels, None when all train."""
        if self.keep is None or not self._masked[i]:
            return None
        f = self.frames[i]
        return self.keep[self.starts[i] : self.starts[i + 1]].reshape(f.h, f.w)

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        jitter: float = 0.0,
        with_index: bool = False,
    ):
        """n training rays drawn uniformly over the unmasked pixels of every image, each through a
        uniformly random point of the square `jitter` pixels wide around its pixel's centre (0:
        the centre; 1: anywhere in the pixel, whose photo value integrates its whole area).
        Returns (o, d, rgba) as `rays_of`, and with `with_index` their global pixel indices (n,)."""
        if self.keep is None:
            idx = torch.randint(0, self.n_pixels, (n,), generator=generator)
        else:  # rejection: draw enough candidates for n kept ones, again while short
            found, have = [], 0
            while have < n:
                m = int((n - have) / self.keep_share * 1.2) + 16
                cand = torch.randint(0, self.n_pixels, (m,), generator=generator)
                cand = cand[self.keep[cand]]
                found.append(cand)
                have += len(cand)
            idx = torch.cat(found)[:n]
        at = 0.5 + (torch.rand(n, 2, generator=generator) - 0.5) * float(jitter) if jitter else None
        if with_index:
            return (*self.rays_of(idx, at), idx)
        return self.rays_of(idx, at)

    def image_of(self, idx: torch.Tensor) -> torch.Tensor:
        """(n,) int64: the frame each global pixel index (n,) belongs to."""
        return torch.searchsorted(self.starts, idx, right=True) - 1

    def pinhole_views(self, samples: int = 129) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Pinhole cameras whose images hold every ray of the frames (for frustum tests).

        A frame without distortion is its own. A distorted or fisheye frame keeps its focal
        lengths; its principal point and image size become the tangent bounds of the rays through
        `samples` points along each edge of the image (the lens maps the image's border to the
        border of its view, so the edges bound every ray).

        Returns:
            intrinsics (M, 4) fx, fy, cx, cy and sizes (M, 2) width, height, float32 pixels with
            the frames' c2w; None when a frame sees 90 degrees or more off its axis, more than
            any pinhole image holds.
        """
        intrinsics = self.intrinsics.clone()
        sizes = torch.tensor([[f.w, f.h] for f in self.frames], dtype=torch.float32)
        if self.distortion is None:
            return intrinsics, sizes
        t = torch.linspace(0, 1, samples)
        zero, one = torch.zeros_like(t), torch.ones_like(t)
        u, v = torch.cat([t, t, zero, one]), torch.cat([zero, one, t, t])
        for i, f in enumerate(self.frames):
            if not (f.distortion or f.fisheye):
                continue
            fe = None if self.fisheye is None else self.fisheye[i].expand(u.shape)
            _, d = rays_from_pixels(
                torch.eye(4), self.intrinsics[i], u * f.w, v * f.h, self.distortion[i], fe
            )
            forward = -d[:, 2]  # camera looks down -z
            if bool((forward <= 1e-3).any()):
                return None
            tx, ty = d[:, 0] / forward, -d[:, 1] / forward  # ty: image down
            intrinsics[i, 2], intrinsics[i, 3] = -tx.min() * f.fx, -ty.min() * f.fy
            sizes[i, 0], sizes[i, 1] = (tx.max() - tx.min()) * f.fx, (ty.max() - ty.min()) * f.fy
        return intrinsics, sizes

    def frame_rays(self, i: int):
        """All rays of frame i, (H*W, 3) origins and unit directions, row-major like frame_rgba."""
        f = self.frames[i]
        dist = None if self.distortion is None else self.distortion[i]
        return image_rays(self.c2w[i], f.fx, f.fy, f.cx, f.cy, f.w, f.h, dist, fisheye=f.fisheye)

    def frame_rgba(self, i: int) -> torch.Tensor:
        """(H, W, 4) float straight-alpha RGBA of frame i."""
        f = self.frames[i]
        return self.pixels[self.starts[i] : self.starts[i + 1]].reshape(f.h, f.w, 4).float() / 255.0
