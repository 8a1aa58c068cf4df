"""Splat compositor benchmark: `python -m experiments.splat_bench` (experiments.kernels_bench runs it too).

Seed 002's scene: Gaussians on a unit sphere shell seen from 3 units at 256 px (fx = 300),
tangential scale 0.06 * sqrt(2500 / n), so coverage stays alike as n grows. One JSON line per
(n, pass) with the median ms of reference / naive / tiled measured interleaved in the same run,
and their ratios. The reference and the naive kernel cost N * H * W per frame, so they are only
run up to --max-reference / --max-naive splats (null above).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

from kernels import splat
from kernels.splat_project import covariance_3d, project_gaussians


def sphere_shell(n: int, seed: int = 0, s_t: float | None = None, s_n: float = 0.01):
    """(means, cov3d, colors, opacities) of n Gaussians flat on the unit sphere."""
    g = torch.Generator().manual_seed(seed)
    s_t = 0.06 * math.sqrt(2500 / n) if s_t is None else s_t
    normal = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)
    means = normal.clone()
    # rotation taking +z (the thin axis) to the normal
    z = torch.tensor([0.0, 0.0, 1.0])
    axis = torch.linalg.cross(z.expand_as(normal), normal)
    s = axis.norm(dim=-1, keepdim=True).clamp(min=1e-9)
    c = normal[:, 2:3]
    half = torch.atan2(s, c) / 2
    quats = torch.cat([torch.cos(half), axis / s * torch.sin(half)], -1)
    scales = torch.tensor([s_t, s_t, s_n]).expand(n, 3)
    colors = torch.rand(n, 3, generator=g)
    opac = torch.full((n,), 0.8)
    return means, covariance_3d(scales, quats), colors, opac


def scene_splats(n: int, size: int = 256, device="cpu"):
    means, cov, colors, opac = sphere_shell(n)
    # Camera at (0, 0, -3) looking at the origin, image up +y (OpenGL axes: columns right, up, back).
    c2w = torch.tensor(
        [[-1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, -1.0, -3.0], [0.0, 0.0, 0.0, 1.0]]
    )
    p = project_gaussians(means, cov, c2w, 300.0, 300.0, size / 2, size / 2, size, size)
    v = p.visible
    order = torch.argsort(p.depths[v])
    return [t[v][order].contiguous().to(device) for t in (p.means2d, p.conics, colors, opac)]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fns, repeats, device):
    for k, fn in fns.items():
        if (
            k != "reference"
        ):  # warm-up is for the compiled extension and allocator, not worth 40 s here
            fn()
    _sync(device)
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():  # interleaved: load from other processes hits all alike
            t = time.perf_counter()
            fn()
            _sync(device)
            times[k].append((time.perf_counter() - t) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


def bench(n, size, device, repeats, methods, backward):
    m, c, col, o = scene_splats(n, size, device)
    params = [t.requires_grad_(backward) for t in (m, c, col, o)]
    g = torch.randn(size, size, 3, device=device)

    def make(method):
        def f():
            rgb, _ = splat.rasterize(*params, size, size, background=1.0, method=method)
            if backward:
                torch.autograd.grad(rgb, params, g)

        return f

    return _median_ms({k: make(k) for k in methods}, repeats, device), int(m.shape[0])


def rows(
    sizes=(2500, 10_000, 40_000, 160_000),
    size=256,
    device="cpu",
    repeats=5,
    max_reference=2500,
    max_naive=10_000,
):
    device = torch.device(device)
    for n in sizes:
        for backward in (False, True):
            methods = (
                ["tiled"]
                + (["naive"] if n <= max_naive else [])
                + (["reference"] if n <= max_reference else [])
            )
            ms, visible = bench(n, size, device, repeats, methods, backward)
            ref, nav, til = ms.get("reference"), ms.get("naive"), ms["tiled"]
            yield {
                "op": "splat_fwd_bwd" if backward else "splat_fwd",
                "size": n,
                "visible": visible,
                "pixels": size * size,
                "device": str(device),
                "threads": torch.get_num_threads(),
                "reference_ms": None if ref is None else round(ref, 2),
                "naive_ms": None if nav is None else round(nav, 2),
                "tiled_ms": round(til, 2),
                "naive_vs_reference": None if ref is None else round(ref / nav, 2),
                "tiled_vs_naive": None if nav is None else round(nav / til, 2),
                "tiled_vs_reference": None if ref is None else round(ref / til, 2),
            }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sizes", default="2500,10000,40000,160000")
    ap.add_argument("--pixels", type=int, default=256, help="image side")
    ap.add_argument(
        "--max-reference", type=int, default=None, help="default 2500 on CPU, 10000 on CUDA"
    )
    ap.add_argument(
        "--max-naive", type=int, default=None, help="default 10000 on CPU, 160000 on CUDA"
    )
    args = ap.parse_args(argv)
    if args.repeats < 5:
        ap.error("--repeats must be >= 5 (figures are medians of at least five runs)")
    gpu = torch.device(args.device).type == "cuda"
    if args.max_reference is None:
        args.max_reference = 10_000 if gpu else 2500
    if args.max_naive is None:
        args.max_naive = 160_000 if gpu else 10_000
    torch.manual_seed(0)
    for row in rows(
        [int(s) for s in args.sizes.split(",")],
        args.pixels,
        args.device,
        args.repeats,
        args.max_reference,
        args.max_naive,
    ):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
