"""CPU hash grid, scalar loops against the AVX2 ones: `python -m experiments.hash_grid_ab`.

NerfConfig's grid (3-D, 16 levels, 2 features, 2^19 rows, 16..2048) at a training step's shapes:
~4700 random rays through the unit cube, 8-23 samples each at the march step (box diagonal /
1024), the forward (no grad) on all samples and the row-sparse backward on ~90 % of them. Both
loops run in this process, alternating (KERNELS_HASH_GRID_SCALAR is read at each call), with
64 MB of other memory traffic before every call. Prints the median and fastest ms per loop.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import torch

import kernels


def ray_samples(gen: torch.Generator, n_rays: int = 4700):
    """(forward points, backward points): runs of samples along random rays, ray by ray."""
    step = math.sqrt(3) / 1024
    c = 0.1 + 0.8 * torch.rand(n_rays, 3, generator=gen)
    d = torch.nn.functional.normalize(torch.randn(n_rays, 3, generator=gen), dim=1)
    cnt = torch.randint(8, 24, (n_rays,), generator=gen)
    ray = torch.repeat_interleave(torch.arange(n_rays), cnt)
    k = torch.arange(ray.numel()) - (torch.cumsum(cnt, 0) - cnt)[ray]
    x = c[ray] + ((k - cnt[ray] // 2) * step)[:, None] * d[ray]
    keep = k < cnt[ray] * 9 // 10 + 1
    return x.contiguous(), x[keep].contiguous()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    grid = kernels.HashGrid(3, 16, 2, 19, 16, finest_resolution=2048)
    mod = kernels._ext.load_cpu()
    meta = (grid.offsets, grid.resolution, grid.scales, grid.hashed)
    values = torch.zeros_like(grid.params)
    touched = torch.zeros(grid.params.shape[0], dtype=torch.uint8)
    sets = [ray_samples(gen) for _ in range(6)]
    junk = torch.empty(64 << 20, dtype=torch.uint8)
    times = {(loop, op): [] for loop in ("scalar", "avx2") for op in ("forward", "backward")}
    for rep in range(args.reps):
        xf, xb = sets[rep % len(sets)]
        go = torch.randn(xb.shape[0], grid.n_output_dims, generator=gen)
        for loop in ("scalar", "avx2") if rep % 2 else ("avx2", "scalar"):
            if loop == "scalar":
                os.environ["KERNELS_HASH_GRID_SCALAR"] = "1"
            else:
                os.environ.pop("KERNELS_HASH_GRID_SCALAR", None)
            junk.add_(1)
            t0 = time.perf_counter()
            with torch.no_grad():
                mod.hash_grid_forward(xf, grid.params, *meta)
            times[loop, "forward"].append(time.perf_counter() - t0)
            junk.add_(1)
            t0 = time.perf_counter()
            mod.hash_grid_backward_rows(xb, go, values, touched, *meta)
            times[loop, "backward"].append(time.perf_counter() - t0)
    os.environ.pop("KERNELS_HASH_GRID_SCALAR", None)
    print(f"threads {args.threads}, points: forward {xf.shape[0]}, backward {xb.shape[0]}")
    print(f"{'':9}{'scalar med':>11}{'avx2 med':>10}{'ratio':>7}{'scalar min':>12}{'avx2 min':>10}")
    for op in ("forward", "backward"):
        a, b = times["scalar", op], times["avx2", op]
        ma, mb = statistics.median(a) * 1e3, statistics.median(b) * 1e3
        print(f"{op:9}{ma:11.2f}{mb:10.2f}{mb / ma:7.3f}{min(a) * 1e3:12.2f}{min(b) * 1e3:10.2f}")


if __name__ == "__main__":
    main()
