"""Load a NeRF dataset in normal form (dataset/cameras.json + images/) into tensors.

Pixels of all images of a split are kept in one flat (P, 4) float32 RGBA tensor (straight alpha;
1 where the photo has none), so rays can be drawn uniformly across all images whatever their
sizes. RGBA photos are composited on a background per ray: random while training (so the field
cannot bake a background colour into the object), a fixed one (default white) for evaluation.
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

from core.scene_format import DISTORTION_KEYS
from worker.cameras import image_rays, rays_from_pixels

NAMED_BACKGROUNDS = {"white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}


def load_meta(dataset_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(dataset_dir) / "cameras.json").read_text())


def background_colors(
    background, n: int, generator: torch.Generator | None = None, device=None
) -> torch.Tensor:
    """(n, 3) colours for "random" | "white" | "black" | (r, g, b)."""
    if background == "random":
        return torch.rand(n, 3, generator=generator, device=device)
    rgb = (
        NAMED_BACKGROUNDS.get(background, background) if isinstance(background, str) else background
    )
    if isinstance(background, str) and background not in NAMED_BACKGROUNDS:
        raise ValueError(f"unknown background {background!r}")
    return torch.as_tensor(rgb, dtype=torch.float32, device=device).reshape(1, 3).expand(n, 3)


def composite(rgba: torch.Tensor, background: torch.Tensor) -> torch.Tensor:
    """Straight-alpha RGBA (..., 4) over a background (..., 3) -> RGB."""
    a = rgba[..., 3:4]
    return rgba[..., :3] * a + background * (1 - a)


@dataclass
class RayBatch:
    origins: torch.Tensor  # (n, 3) normalised frame
    dirs: torch.Tensor  # (n, 3) unit
    rgb: torch.Tensor  # (n, 3) target, already composited on `background`
    alpha: torch.Tensor  # (n,)
    background: torch.Tensor  # (n, 3): composite the rendered colour on the same one
    image_index: torch.Tensor  # (n,) long, into the dataset's frames
    pixel_index: torch.Tensor  # (n,) long, into the flat pixel tensor


@dataclass
class NerfDataset:
    frames: list[dict]  # the cameras.json entries of this split
    rgba: torch.Tensor  # (P, 4) float32
    offsets: torch.Tensor  # (N + 1,) long: image k owns pixels offsets[k]:offsets[k+1]
    sizes: torch.Tensor  # (N, 2) long: width, height
    c2w: torch.Tensor  # (N, 4, 4) float32, normalised frame
    intrinsics: torch.Tensor  # (N, 4) float32: fx, fy, cx, cy
    distortion: torch.Tensor | None  # (N, 5) k1 k2 k3 p1 p2, None when no frame has any
    aabb: torch.Tensor  # (2, 3)
    has_alpha: bool
    meta: dict

    @property
    def n_images(self) -> int:
        return len(self.frames)

    @property
    def n_pixels(self) -> int:
        return int(self.rgba.shape[0])

    @property
    def normalization(self) -> dict:
        return self.meta["normalization"]

    def to(self, device) -> NerfDataset:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return NerfDataset(
            self.frames,
            move(self.rgba),
            move(self.offsets),
            move(self.sizes),
            move(self.c2w),
            move(self.intrinsics),
            move(self.distortion),
            move(self.aabb),
            self.has_alpha,
            self.meta,
        )

    def image_rgba(self, k: int) -> torch.Tensor:
        w, h = (int(v) for v in self.sizes[k])
        return self.rgba[self.offsets[k] : self.offsets[k + 1]].reshape(h, w, 4)

    def image(self, k: int, background="white") -> torch.Tensor:
        """(H, W, 3) ground truth on a fixed background."""
        rgba = self.image_rgba(k)
        return composite(
            rgba, background_colors(background, 1, device=rgba.device).reshape(1, 1, 3)
        )

    def rays(self, k: int):
        """All rays of image k, (H*W, 3) origins and unit directions, row-major like `image(k)`."""
        f = self.frames[k]
        dist = None if self.distortion is None else self.distortion[k]
        return image_rays(
            self.c2w[k],
            f["fx"],
            f["fy"],
            f["cx"],
            f["cy"],
            f["w"],
            f["h"],
            dist,
            device=self.rgba.device,
        )

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        background="random",
        jitter: bool = False,
    ) -> RayBatch:
        """n rays drawn uniformly over all pixels of all images; `jitter` picks a random point in the pixel."""
        dev = self.rgba.device
        idx = torch.randint(0, self.n_pixels, (n,), generator=generator, device=dev)
        img = torch.searchsorted(self.offsets, idx, right=True) - 1
        local = idx - self.offsets[img]
        w = self.sizes[img, 0]
        if jitter:
            sub = torch.rand(n, 2, generator=generator, device=dev)
        else:
            sub = torch.full((n, 2), 0.5, device=dev)
        px = (local % w).to(torch.float32) + sub[:, 0]
        py = torch.div(local, w, rounding_mode="floor").to(torch.float32) + sub[:, 1]
        dist = None if self.distortion is None else self.distortion[img]
        o, d = rays_from_pixels(self.c2w[img], self.intrinsics[img], px, py, dist)
        rgba = self.rgba[idx]
        bg = background_colors(background, n, generator, dev)
        return RayBatch(o, d, composite(rgba, bg), rgba[:, 3], bg, img, idx)


def _read_rgba(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGBA"), dtype=np.uint8)


def load_dataset(
    dataset_dir: str | Path, split: str | Iterable[str] = "train", device=None
) -> NerfDataset:
    """The frames of one split (or several) of a dataset folder written by service.intake.nerf."""
    dataset_dir = Path(dataset_dir)
    meta = load_meta(dataset_dir)
    splits = {split} if isinstance(split, str) else set(split)
    frames = [f for f in meta["frames"] if f["split"] in splits]
    if not frames:
        raise ValueError(f"dataset has no frames in split {sorted(splits)}")
    chunks, offsets = [], [0]
    for f in frames:
        arr = _read_rgba(dataset_dir / f["file"])
        if arr.shape[:2] != (f["h"], f["w"]):
            raise ValueError(
                f"{f['file']} is {arr.shape[1]}x{arr.shape[0]}, cameras.json says {f['w']}x{f['h']}"
            )
        chunks.append(arr.reshape(-1, 4))
        offsets.append(offsets[-1] + chunks[-1].shape[0])
    rgba = torch.from_numpy(np.concatenate(chunks)).to(torch.float32).div_(255.0)
    has_dist = any(f.get("distortion") for f in frames)
    dist = (
        torch.tensor(
            [[f.get("distortion", {}).get(k, 0.0) for k in DISTORTION_KEYS] for f in frames],
            dtype=torch.float32,
        )
        if has_dist
        else None
    )
    ds = NerfDataset(
        frames=frames,
        rgba=rgba,
        offsets=torch.tensor(offsets, dtype=torch.long),
        sizes=torch.tensor([[f["w"], f["h"]] for f in frames], dtype=torch.long),
        c2w=torch.tensor([f["c2w"] for f in frames], dtype=torch.float32),
        intrinsics=torch.tensor(
            [[f["fx"], f["fy"], f["cx"], f["cy"]] for f in frames], dtype=torch.float32
        ),
        distortion=dist,
        aabb=torch.tensor(meta["aabb"], dtype=torch.float32),
        has_alpha=bool(meta.get("has_alpha")),
        meta=meta,
    )
    return ds if device is None else ds.to(device)
