"""A posed-photo dataset whose ground truth is exact: numpy ray-traced textured spheres and boxes.

Blender convention (transforms_train.json / transforms_test.json, camera_angle_x, c2w with OpenGL
axes, RGBA PNGs with a transparent background). Shading is Lambertian under a fixed light, so the
appearance does not depend on the viewer and a NeRF can match it exactly; `render()` gives the
ground truth for any pose, for checking renders.

    python -m experiments.synthetic_scene --out scene.zip [--size 100 --train 60 --test 10 --seed 0]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

CAMERA_DISTANCE = 3.5
FOV_X_DEG = 40.0
LIGHT = np.array([0.4, -0.5, 0.8]) / np.linalg.norm([0.4, -0.5, 0.8])
AMBIENT = 0.35


@dataclass
class Sphere:
    center: tuple[float, float, float]
    radius: float
    colors: tuple[tuple[float, float, float], tuple[float, float, float]]
    checks: tuple[int, int] = (8, 4)  # around, pole to pole


@dataclass
class Box:
    center: tuple[float, float, float]
    half: tuple[float, float, float]
    colors: tuple[tuple[float, float, float], tuple[float, float, float]]
    yaw_deg: float = 0.0  # rotation about world z
    cell: float = 0.2  # checker cell size in world units
    inside: bool = False  # seen from inside (a room): its faces are lit on their inner side


@dataclass
class Scene:
    objects: list = field(default_factory=list)
    # Optional luminance texture (H, W) in [0, 1] modulating every surface, mapped triplanar in
    # world units (`texture_tile` per repeat): structure from motion needs detail at pixel
    # scale, which the checkers alone do not give.
    texture: np.ndarray | None = None
    texture_tile: float = 2.0

    def bounding_radius(self) -> float:
        r = 0.0
        for o in self.objects:
            ext = o.radius if isinstance(o, Sphere) else float(np.linalg.norm(o.half))
            r = max(r, float(np.linalg.norm(o.center)) + ext)
        return r


def default_scene() -> Scene:
    """Everything fits in a ball of radius ~1.2 around the origin."""
    return Scene(
        [
            Sphere((-0.42, 0.05, 0.0), 0.42, ((0.9, 0.2, 0.15), (0.95, 0.8, 0.2)), (8, 4)),
            Sphere((0.48, 0.4, -0.12), 0.3, ((0.15, 0.3, 0.9), (0.9, 0.9, 0.95)), (6, 3)),
            Box(
                (0.35, -0.42, -0.1),
                (0.25, 0.22, 0.32),
                ((0.2, 0.7, 0.3), (0.1, 0.25, 0.1)),
                yaw_deg=30.0,
                cell=0.16,
            ),
            Box(
                (0.0, 0.0, -0.58),
                (0.68, 0.68, 0.08),
                ((0.55, 0.55, 0.6), (0.9, 0.5, 0.2)),
                yaw_deg=0.0,
                cell=0.34,
            ),
        ]
    )


def dead_leaves(size: int = 512, n: int = 3000, seed: int = 0) -> np.ndarray:
    """A dead-leaves texture (overlapping discs, power-law radii; Lee, Mumford & Huang 2001):
    occlusion edges and blobs at every scale, like natural images, so SIFT finds features."""
    from PIL import ImageDraw

    rng = np.random.default_rng(seed)
    im = Image.new("L", (size, size), 128)
    draw = ImageDraw.Draw(im)
    radii = np.minimum((rng.pareto(2.0, n) + 1) * size / 128, size / 8)
    for r in radii:
        x, y = rng.uniform(0, size, 2)
        ry = r * rng.uniform(0.5, 1.5)
        draw.ellipse([x - r, y - ry, x + r, y + ry], fill=int(rng.integers(0, 256)))
    return np.asarray(im, dtype=np.float64) / 255


def textured_scene(seed: int = 0) -> Scene:
    """default_scene() with a dead-leaves texture on every surface."""
    scene = default_scene()
    scene.texture = dead_leaves(seed=seed)
    return scene


def _triplanar(tex: np.ndarray, tile: float, p: np.ndarray, normal: np.ndarray) -> np.ndarray:
    axis = np.abs(normal).argmax(1)[:, None]
    uv = np.where(axis == 0, p[:, [1, 2]], np.where(axis == 1, p[:, [0, 2]], p[:, [0, 1]]))
    ij = np.floor((uv / tile % 1.0) * np.array(tex.shape[::-1])).astype(int)
    return tex[ij[:, 1] % tex.shape[0], ij[:, 0] % tex.shape[1]]


def _rot_z(deg: float) -> np.ndarray:
    a = math.radians(deg)
    return np.array([[math.cos(a), -math.sin(a), 0], [math.sin(a), math.cos(a), 0], [0, 0, 1.0]])


def _intersect_sphere(o, d, s: Sphere):
    c = np.asarray(s.center)
    oc = o - c
    b = np.einsum("ij,ij->i", d, oc)
    disc = b * b - (np.einsum("ij,ij->i", oc, oc) - s.radius**2)
    hit = disc >= 0
    sq = np.sqrt(np.where(hit, disc, 0.0))
    t = np.where(-b - sq > 1e-9, -b - sq, -b + sq)
    t = np.where(hit & (t > 1e-9), t, np.inf)

    def shade(p):
        n = (p - c) / s.radius
        u = np.arctan2(n[:, 1], n[:, 0]) / (2 * np.pi) + 0.5
        v = np.arccos(np.clip(n[:, 2], -1, 1)) / np.pi
        check = (np.floor(u * s.checks[0]) + np.floor(v * s.checks[1])) % 2
        return n, check

    return t, shade


def _intersect_box(o, d, b: Box):
    r = _rot_z(b.yaw_deg)
    c, h = np.asarray(b.center), np.asarray(b.half)
    ol, dl = (o - c) @ r, d @ r  # into the box frame (r is orthonormal)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / dl
        t1, t2 = (-h - ol) * inv, (h - ol) * inv
    tlo, thi = np.minimum(t1, t2), np.maximum(t1, t2)
    tlo = np.nan_to_num(tlo, nan=-np.inf)
    thi = np.nan_to_num(thi, nan=np.inf)
    tmin, tmax = tlo.max(1), thi.min(1)
    hit = (tmax >= tmin) & (tmax > 1e-9)
    t = np.where(hit, np.where(tmin > 1e-9, tmin, tmax), np.inf)

    def shade(p):
        pl = (p - c) @ r
        ax = np.abs(pl / h).argmax(1)  # the face the point lies on
        nl = np.zeros_like(pl)
        nl[np.arange(len(pl)), ax] = np.sign(pl[np.arange(len(pl)), ax])
        check = np.floor(pl / b.cell + 1e-7).sum(1) % 2
        return (-nl if b.inside else nl) @ r.T, check

    return t, shade


def trace(scene: Scene, origins: np.ndarray, dirs: np.ndarray):
    """(rgb (N,3), alpha (N,), depth (N,) distance along the unit ray, inf on a miss)."""
    n = len(origins)
    best = np.full(n, np.inf)
    owner = np.full(n, -1)
    shaders = []
    for k, obj in enumerate(scene.objects):
        t, shade = (_intersect_sphere if isinstance(obj, Sphere) else _intersect_box)(
            origins, dirs, obj
        )
        closer = t < best
        best[closer], owner[closer] = t[closer], k
        shaders.append(shade)
    rgb = np.zeros((n, 3))
    for k, obj in enumerate(scene.objects):
        m = owner == k
        if not m.any():
            continue
        p = origins[m] + dirs[m] * best[m, None]
        normal, check = shaders[k](p)
        base = np.where(check[:, None] > 0.5, np.asarray(obj.colors[1]), np.asarray(obj.colors[0]))
        lambert = AMBIENT + (1 - AMBIENT) * np.clip(normal @ LIGHT, 0, None)
        if scene.texture is not None:
            lambert = lambert * (
                0.4 + 1.2 * _triplanar(scene.texture, scene.texture_tile, p, normal)
            )
        rgb[m] = base * lambert[:, None]
    return np.clip(rgb, 0, 1), (owner >= 0).astype(np.float64), best


def camera_rays(
    c2w: np.ndarray,
    width: int,
    height: int,
    fx: float,
    fy: float | None = None,
    cx: float | None = None,
    cy: float | None = None,
    sub: tuple[float, float] = (0.5, 0.5),
):
    """Unit rays through pixel (i + sub_x, j + sub_y), OpenGL camera axes; sub=(0.5, 0.5) is the centre."""
    fy = fx if fy is None else fy
    cx = width / 2 if cx is None else cx
    cy = height / 2 if cy is None else cy
    i, j = np.meshgrid(np.arange(width) + sub[0], np.arange(height) + sub[1], indexing="xy")
    d = np.stack([(i - cx) / fx, -(j - cy) / fy, -np.ones_like(i)], -1).reshape(-1, 3)
    d = d @ np.asarray(c2w)[:3, :3].T
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    o = np.broadcast_to(np.asarray(c2w)[:3, 3], d.shape).copy()
    return o, d


def render(
    c2w,
    width: int,
    height: int,
    fx: float | None = None,
    fy: float | None = None,
    cx: float | None = None,
    cy: float | None = None,
    *,
    fov_x_deg: float = FOV_X_DEG,
    scene: Scene | None = None,
    supersample: int = 1,
) -> dict[str, np.ndarray]:
    """Ground truth for any pose (dataset world frame): rgba (H,W,4) straight alpha, depth (H,W) (inf: miss)."""
    scene = scene or default_scene()
    fx = fx if fx is not None else 0.5 * width / math.tan(math.radians(fov_x_deg) / 2)
    acc_rgb = np.zeros((height * width, 3))
    acc_a = np.zeros(height * width)
    depth = np.full(height * width, np.inf)
    for sy in range(supersample):
        for sx in range(supersample):
            sub = ((sx + 0.5) / supersample, (sy + 0.5) / supersample)
            o, d = camera_rays(
                np.asarray(c2w, dtype=np.float64), width, height, fx, fy, cx, cy, sub
            )
            rgb, a, t = trace(scene, o, d)
            acc_rgb += rgb * a[:, None]
            acc_a += a
            depth = np.minimum(depth, t)
    acc_a /= supersample**2
    acc_rgb /= supersample**2
    straight = np.where(acc_a[:, None] > 0, acc_rgb / np.maximum(acc_a[:, None], 1e-12), 0.0)
    rgba = (
        np.concatenate([straight, acc_a[:, None]], 1).reshape(height, width, 4).astype(np.float32)
    )
    return {"rgba": rgba, "depth": depth.reshape(height, width).astype(np.float32)}


def look_at(eye, target=(0.0, 0.0, 0.0), up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """c2w (4x4, OpenGL: the camera looks down -z, y is up in the image)."""
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    fwd = target - eye
    fwd /= np.linalg.norm(fwd)
    right = np.cross(fwd, up)
    right /= np.linalg.norm(right)
    true_up = np.cross(right, fwd)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, true_up, -fwd, eye
    return m


def sphere_poses(
    n: int, radius: float = CAMERA_DISTANCE, seed: int = 0, spiral: bool = True
) -> list[np.ndarray]:
    """Cameras on a sphere looking at the origin: a Fibonacci spiral (even cover) or random directions."""
    rng = np.random.default_rng(seed)
    if spiral:
        k = np.arange(n)
        z = 1 - (2 * k + 1) / n
        phi = k * math.pi * (3 - math.sqrt(5)) + rng.uniform(0, 2 * math.pi)
    else:
        z = rng.uniform(-0.9, 0.9, n)
        phi = rng.uniform(0, 2 * math.pi, n)
    # Keep away from the poles, where look_at with up=z degenerates.
    z = np.clip(z, -0.97, 0.97)
    s = np.sqrt(1 - z * z)
    dirs = np.stack([s * np.cos(phi), s * np.sin(phi), z], 1)
    return [look_at(radius * d) for d in dirs]


def orbit_poses(
    n: int, radius: float = CAMERA_DISTANCE, elevation_deg: float = 20.0, wobble_deg: float = 15.0
) -> list[np.ndarray]:
    """A hand-held-like loop around the origin: one turn, elevation wobbling twice per turn;
    consecutive poses are close, as in a video."""
    poses = []
    for k in range(n):
        a = 2 * math.pi * k / n
        el = math.radians(elevation_deg + wobble_deg * math.sin(2 * a))
        eye = radius * np.array(
            [math.cos(el) * math.cos(a), math.cos(el) * math.sin(a), math.sin(el)]
        )
        poses.append(look_at(eye))
    return poses


def _png(rgba: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.round(np.clip(rgba, 0, 1) * 255).astype(np.uint8), "RGBA").save(buf, "PNG")
    return buf.getvalue()


def scene_files(
    size: int = 100,
    n_train: int = 60,
    n_test: int = 10,
    seed: int = 0,
    scene: Scene | None = None,
    supersample: int = 1,
) -> dict[str, bytes]:
    """The dataset as {relative path: bytes}."""
    scene = scene or default_scene()
    fov_x = math.radians(FOV_X_DEG)
    files: dict[str, bytes] = {}
    for split, poses in (
        ("train", sphere_poses(n_train, seed=seed)),
        ("test", sphere_poses(n_test, seed=seed + 1, spiral=False)),
    ):
        frames = []
        for i, c2w in enumerate(poses):
            img = render(c2w, size, size, fov_x_deg=FOV_X_DEG, scene=scene, supersample=supersample)
            files[f"{split}/r_{i}.png"] = _png(img["rgba"])
            frames.append(
                {"file_path": f"./{split}/r_{i}", "rotation": 0.0, "transform_matrix": c2w.tolist()}
            )
        files[f"transforms_{split}.json"] = json.dumps(
            {"camera_angle_x": fov_x, "frames": frames}, indent=1
        ).encode()
    return files


def make_scene(
    out: str | Path,
    size: int = 100,
    n_train: int = 60,
    n_test: int = 10,
    seed: int = 0,
    scene: Scene | None = None,
    supersample: int = 1,
) -> Path:
    """Write the dataset to `out`: a .zip file, or a folder for any other name."""
    out = Path(out)
    files = scene_files(size, n_train, n_test, seed, scene, supersample)
    if out.suffix == ".zip":
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in files.items():
                zf.writestr(name, data)
    else:
        for name, data in files.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_bytes(data)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output .zip (or a folder)")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--train", type=int, default=60)
    ap.add_argument("--test", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--supersample", type=int, default=1, help="rays per pixel side (anti-aliasing)"
    )
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    path = make_scene(a.out, a.size, a.train, a.test, a.seed, supersample=a.supersample)
    print(
        f"wrote {path} ({a.train} train + {a.test} test views, {a.size}x{a.size}) "
        f"in {time.perf_counter() - t0:.1f}s"
    )


if __name__ == "__main__":
    main()
