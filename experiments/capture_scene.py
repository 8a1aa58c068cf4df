"""A capture-like dataset with exact ground truth: a textured object on a textured table inside a
textured room, photographed as on a phone.

~50 portrait (9:16) photos on an inward arc around the table, through a lens with OpenCV radial
distortion (k1, k2), the room filling most of every photo (ray traced by
experiments/synthetic_scene.py's tracer, so appearance is Lambertian and exact). Three uploads:
- `posed`: instant-ngp's transforms.json (fl_x, fl_y, cx, cy, w, h, k1, k2, p1, p2, no
  aabb_scale: chosen from the data) with JPEG photos, as instant-ngp's tooling exports;
- `unposed`: the same photos only, for SfM;
- `object`: the same object alone in empty space (RGBA, transparent background), same cameras,
  without distortion: the bar the room scene is compared with.

    python -m experiments.capture_scene --out /tmp/capture [--views 50 --width 180 --height 320]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from experiments.synthetic_scene import Box, Scene, Sphere, dead_leaves, look_at, trace

TARGET = np.array([0.0, 0.0, -0.25])  # what the cameras look at: the object on the table
ARC_DEG = 200.0  # walked half-way round the table and a bit
RADIUS = 3.0
ELEVATION_DEG = (22.0, 38.0)  # wobbling up and down along the arc, as by hand
FOV_Y_DEG = 64.0  # a phone's main camera held upright
K1, K2 = -0.08, 0.02  # mild barrel distortion
JPEG_QUALITY = 92


def the_object() -> list:
    """Two checkered spheres and a box, ~1.5 units across, standing on z = -0.68."""
    return [
        Sphere((-0.42, 0.05, -0.26), 0.42, ((0.9, 0.2, 0.15), (0.95, 0.8, 0.2)), (8, 4)),
        Sphere((0.48, 0.4, -0.38), 0.3, ((0.15, 0.3, 0.9), (0.9, 0.9, 0.95)), (6, 3)),
        Box(
            (0.35, -0.42, -0.36),
            (0.25, 0.22, 0.32),
            ((0.2, 0.7, 0.3), (0.1, 0.25, 0.1)),
            yaw_deg=30.0,
            cell=0.16,
        ),
    ]


def table_and_room() -> list:
    """A table top on four legs, and the room around it (floor z = -2.2, walls 5-6 units out)."""
    wood = ((0.55, 0.38, 0.22), (0.45, 0.3, 0.16))
    legs = [
        Box((sx * 1.45, sy * 0.85, -1.46), (0.06, 0.06, 0.74), wood, cell=0.5)
        for sx in (-1, 1)
        for sy in (-1, 1)
    ]
    return [
        Box((0.0, 0.0, -0.72), (1.6, 1.0, 0.04), wood, yaw_deg=0.0, cell=0.5),
        *legs,
        Box(
            (0.5, -0.3, 0.8),
            (5.5, 6.0, 3.0),
            ((0.78, 0.74, 0.66), (0.45, 0.55, 0.68)),
            yaw_deg=12.0,
            cell=1.1,
            inside=True,
        ),
        # a cupboard against a wall, so the room is not a plain box
        Box((-3.5, 3.6, -1.0), (1.0, 0.5, 1.2), ((0.3, 0.3, 0.35), (0.8, 0.3, 0.3)), cell=0.4),
    ]


def room_scene(seed: int = 0) -> Scene:
    return Scene(
        [*the_object(), *table_and_room()], texture=dead_leaves(seed=seed), texture_tile=1.5
    )


def object_scene(seed: int = 0) -> Scene:
    return Scene(the_object(), texture=dead_leaves(seed=seed), texture_tile=1.5)


@dataclass
class Lens:
    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    k1: float = 0.0
    k2: float = 0.0

    def rays(self, c2w: np.ndarray, sub=(0.5, 0.5)) -> tuple[np.ndarray, np.ndarray]:
        """Unit world rays through pixel (i + sub_x, j + sub_y) of the distorted photo: the
        OpenCV model x_d = x_u (1 + k1 r^2 + k2 r^4), inverted by fixed-point iteration."""
        i, j = np.meshgrid(
            np.arange(self.width) + sub[0], np.arange(self.height) + sub[1], indexing="xy"
        )
        xd, yd = (i - self.cx) / self.fx, (j - self.cy) / self.fy
        xu, yu = xd.copy(), yd.copy()
        for _ in range(30):
            r2 = xu * xu + yu * yu
            f = 1 + self.k1 * r2 + self.k2 * r2 * r2
            xu, yu = xd / f, yd / f
        d = np.stack([xu, -yu, -np.ones_like(xu)], -1).reshape(-1, 3)  # OpenGL camera axes
        d = d @ np.asarray(c2w)[:3, :3].T
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        return np.broadcast_to(np.asarray(c2w)[:3, 3], d.shape).copy(), d


def phone_lens(width: int, height: int, distorted: bool = True) -> Lens:
    f = 0.5 * height / math.tan(math.radians(FOV_Y_DEG) / 2)
    k1, k2 = (K1, K2) if distorted else (0.0, 0.0)
    return Lens(width, height, f, f, width / 2, height / 2, k1, k2)


def arc_poses(n: int, seed: int = 0) -> list[np.ndarray]:
    """Inward-looking cameras along an arc around the table, at hand-held heights and aims."""
    rng = np.random.default_rng(seed)
    poses = []
    for k in range(n):
        a = math.radians(-ARC_DEG / 2 + ARC_DEG * k / max(n - 1, 1)) - math.pi / 2
        lo, hi = ELEVATION_DEG
        el = math.radians(lo + (hi - lo) * (0.5 + 0.5 * math.sin(3 * a)))
        r = RADIUS * (1 + rng.uniform(-0.06, 0.06))
        eye = TARGET + r * np.array(
            [math.cos(el) * math.cos(a), math.cos(el) * math.sin(a), math.sin(el)]
        )
        poses.append(look_at(eye, TARGET + rng.normal(0, 0.08, 3)))
    return poses


def render(scene: Scene, lens: Lens, c2w: np.ndarray, supersample: int = 2) -> np.ndarray:
    """(H, W, 4) straight-alpha RGBA in [0, 1], averaged over supersample^2 rays a pixel."""
    acc = np.zeros((lens.height * lens.width, 4))
    for sy in range(supersample):
        for sx in range(supersample):
            sub = ((sx + 0.5) / supersample, (sy + 0.5) / supersample)
            rgb, a, _ = trace(scene, *lens.rays(c2w, sub))
            acc[:, :3] += rgb * a[:, None]
            acc[:, 3] += a
    acc /= supersample**2
    rgb = np.where(acc[:, 3:] > 0, acc[:, :3] / np.maximum(acc[:, 3:], 1e-12), 0.0)
    return np.concatenate([rgb, acc[:, 3:]], 1).reshape(lens.height, lens.width, 4)


def _encode(rgba: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    px = np.round(np.clip(rgba, 0, 1) * 255).astype(np.uint8)
    if fmt == "JPEG":
        Image.fromarray(px[..., :3]).save(buf, "JPEG", quality=JPEG_QUALITY)
    else:
        Image.fromarray(px, "RGBA").save(buf, "PNG")
    return buf.getvalue()


def _transforms(lens: Lens, poses: list[np.ndarray], names: list[str]) -> bytes:
    """instant-ngp's transforms.json: shared intrinsics with OpenCV k1, k2, p1, p2."""
    doc = {
        "camera_angle_x": 2 * math.atan(0.5 * lens.width / lens.fx),
        "fl_x": lens.fx,
        "fl_y": lens.fy,
        "cx": lens.cx,
        "cy": lens.cy,
        "w": lens.width,
        "h": lens.height,
        "k1": lens.k1,
        "k2": lens.k2,
        "p1": 0.0,
        "p2": 0.0,
        "frames": [
            {"file_path": n, "transform_matrix": np.asarray(c).tolist()}
            for n, c in zip(names, poses)
        ],
    }
    return json.dumps(doc, indent=1).encode()


def capture_files(
    n_views: int = 50, width: int = 180, height: int = 320, seed: int = 0, supersample: int = 2
) -> dict[str, dict[str, bytes]]:
    """{"posed" | "unposed" | "object": {path in the archive: bytes}}."""
    poses = arc_poses(n_views, seed)
    lens = phone_lens(width, height)
    pinhole = phone_lens(width, height, distorted=False)
    room, alone = room_scene(seed), object_scene(seed)
    names = [f"images/IMG_{1000 + k}.jpg" for k in range(n_views)]
    photos = {n: _encode(render(room, lens, c, supersample), "JPEG") for n, c in zip(names, poses)}
    obj_names = [f"images/obj_{k:03d}.png" for k in range(n_views)]
    obj = {
        n: _encode(render(alone, pinhole, c, supersample), "PNG") for n, c in zip(obj_names, poses)
    }
    return {
        "posed": {**photos, "transforms.json": _transforms(lens, poses, names)},
        "unposed": dict(photos),
        "object": {**obj, "transforms.json": _transforms(pinhole, poses, obj_names)},
    }


def zip_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for posed/unposed/object.zip")
    ap.add_argument("--views", type=int, default=50)
    ap.add_argument("--width", type=int, default=180)
    ap.add_argument("--height", type=int, default=320)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    a.out.mkdir(parents=True, exist_ok=True)
    for name, files in capture_files(a.views, a.width, a.height, a.seed).items():
        (a.out / f"{name}.zip").write_bytes(zip_bytes(files))
    print(f"wrote {a.out}/{{posed,unposed,object}}.zip in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
