"""Benchmark every compiled op against pure torch: `python -m experiments.kernels_bench`.

Two pure-torch baselines per op, measured interleaved with the compiled kernel in the same run:
the reference in kernels/ (written for exactness; the tests hold the kernels to it) and, where the
reference is slow for reasons unrelated to the op, a tuned version from
experiments/kernels_baselines.py. Prints one JSON object per line (op, size, reference_ms,
tuned_ms, ext_ms, speedup_vs_reference, speedup_vs_tuned, ...), each time the median of --repeats
runs after a warm-up, then a markdown table of the same rows on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

import kernels
from experiments import kernels_baselines as tuned


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_ms(fn, device):
    t = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - t) * 1000


def _medians_ms(fns, repeats, device):
    """Median per function, runs interleaved so that load from other processes hits both alike."""
    for fn in fns:
        fn()
    _sync(device)
    times = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            times[k].append(_time_ms(fn, device))
    return [statistics.median(t) for t in times]


def bench_hash_grid(device, dims=3, n=2**18):
    grid = kernels.HashGrid(dims, 16, 2, 19, 16, finest_resolution=2048 if dims == 3 else 4096).to(
        device
    )
    x = torch.rand(n, dims, device=device)
    w = torch.randn(n, grid.n_output_dims, device=device)

    def run(backend):
        def f():
            out = tuned.hash_grid_tuned(x, grid) if backend == "tuned" else grid(x, backend=backend)
            return torch.autograd.grad(out, grid.params, w)

        return f

    return f"hash_grid_{dims}d_fwd_bwd", n, run


def bench_sh(device, n=2**18):
    d = torch.nn.functional.normalize(torch.randn(n, 3, device=device), dim=-1)
    # The reference is already one vectorised expression per coefficient: no separate tuned one.
    return (
        "sh_encode_fwd",
        n,
        lambda b: None if b == "tuned" else lambda: kernels.sh_encode(d, 4, backend=b),
    )


def bench_composite(device, n=2**18, per_ray=64):
    n_rays = n // per_ray
    ri = torch.repeat_interleave(torch.arange(n_rays, device=device), per_ray)
    dt = torch.full((n,), 2.0 / 1024 * math.sqrt(3), device=device)
    t0 = (torch.arange(n, device=device) % per_ray).float() * dt + 0.5
    t1 = t0 + dt
    sig = (torch.rand(n, device=device) * 10).requires_grad_(True)
    rgb = torch.rand(n, 3, device=device).requires_grad_(True)
    gw = [
        torch.randn(n_rays, 3, device=device),
        torch.randn(n_rays, device=device),
        torch.randn(n_rays, device=device),
    ]

    offsets = kernels.ray_offsets(ri, n_rays)

    def run(backend):
        def f():
            if backend == "tuned":
                out = tuned.composite_tuned(sig, rgb, t0, t1, ri, n_rays, offsets, background=1.0)
            else:
                out = kernels.composite(
                    sig, rgb, t0, t1, ri, n_rays, background=1.0, offsets=offsets, backend=backend
                )
            return torch.autograd.grad(out, [sig, rgb], gw)

        return f

    return "composite_fwd_bwd", n, run


def _scene_grid(device, res=128):
    grid = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=res).to(device)
    grid.update(lambda x: 50.0 * ((x.norm(dim=-1) - 0.6).abs() < 0.1).float(), warmup=True)
    return grid


def bench_march(device, n=2**14):
    grid = _scene_grid(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    o = torch.randn(n, 3, generator=gen)
    o = (2.5 * o / o.norm(dim=-1, keepdim=True)).to(device)
    d = torch.nn.functional.normalize(
        -o + 0.5 * torch.randn(n, 3, generator=gen).to(device), dim=-1
    )
    step = 2 * math.sqrt(3) / 1024

    def run(backend):
        if backend == "tuned":
            return lambda: tuned.march_tuned(o, d, grid, step, max_samples=1024)
        return lambda: kernels.march_rays(
            o, d, grid, render_step_size=step, max_samples=1024, backend=backend
        )

    return "march_rays", n, run


def bench_bitfield(device):
    grid = _scene_grid(device)
    # The reference is already vectorised bit packing: no separate tuned one.
    return (
        "occupancy_binarize",
        grid.n_cells,
        lambda b: None if b == "tuned" else lambda: grid.binarize(backend=b),
    )


def _nerf_mlps(device):
    # NerfField's default networks: 32 -> 64 -> 16 (density), 16 + 15 -> 64 -> 64 -> 3 (colour).
    def seq(*dims):
        layers = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(torch.nn.Linear(a, b))
            if i < len(dims) - 2:
                layers.append(torch.nn.ReLU(inplace=True))
        return torch.nn.Sequential(*layers).to(device)

    dens, col = seq(32, 64, 16), seq(31, 64, 64, 3)

    def pairs(net):
        return [(m.weight, m.bias) for m in net if isinstance(m, torch.nn.Linear)]

    return dens, col, pairs(dens), pairs(col)


def bench_nerf_mlp(device, n=2**16):
    if device.type != "cpu":
        return None  # the fused MLPs are CPU code; nn.Linear serves CUDA
    dens, col, dp, cp = _nerf_mlps(device)
    enc = torch.randn(n, 32, device=device, requires_grad=True)
    sh = torch.randn(n, 16, device=device)
    params = [enc, *dens.parameters(), *col.parameters()]
    gw = [torch.randn(n, device=device), torch.randn(n, 3, device=device)]

    def run(backend):
        def f():
            if backend == "tuned":
                out = tuned.nerf_mlp_tuned(enc, dens, sh, col)
            else:
                out = kernels.nerf_mlp(enc, dp, sh, cp, backend=backend)
            return torch.autograd.grad(out, params, gw)

        return f

    return "nerf_mlp_fwd_bwd", n, run


def bench_nerf_density(device, n=2**17):
    # The no-grad density pass over every marched sample (rendering._encode_chunked).
    if device.type != "cpu":
        return None
    dens, _, dp, _ = _nerf_mlps(device)
    enc = torch.randn(n, 32, device=device)

    def run(backend):
        @torch.no_grad()
        def f():
            if backend == "tuned":
                return tuned.nerf_mlp_tuned(enc, dens)
            return kernels.nerf_mlp(enc, dp, backend=backend)

        return f

    return "nerf_density_nograd", n, run


BENCHES = {
    "hash_grid": bench_hash_grid,
    "hash_grid_2d": lambda dev: bench_hash_grid(dev, dims=2),
    "sh": bench_sh,
    "composite": bench_composite,
    "march": bench_march,
    "bitfield": bench_bitfield,
    "nerf_mlp": bench_nerf_mlp,
    "nerf_density": bench_nerf_density,
}


def _table(rows) -> str:
    def f(v):
        return "n/a" if v is None else f"{v}"

    lines = [
        "| op | size | reference_ms | tuned_ms | ext_ms | vs reference | vs tuned |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['op']}` | {r['size']} | {r['reference_ms']} | {f(r['tuned_ms'])} | "
            f"{r['ext_ms']} | **{r['speedup_vs_reference']}x** | "
            f"{'n/a' if r['speedup_vs_tuned'] is None else '**' + str(r['speedup_vs_tuned']) + 'x**'} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ops", default=",".join(BENCHES), help="comma list of " + ",".join(BENCHES))
    ap.add_argument(
        "--splat", action="store_true", help="then run experiments.splat_bench on the same device"
    )
    args = ap.parse_args(argv)
    if args.repeats < 5:
        ap.error("--repeats must be >= 5 (figures are medians of at least five runs)")
    device = torch.device(args.device)
    torch.manual_seed(0)
    rows = []
    for name in args.ops.split(","):
        spec = BENCHES[name](device)
        if spec is None:  # no compiled op for this device
            continue
        op, size, make = spec
        fns = {b: make(b) for b in ("reference", "tuned", "ext")}
        fns = {b: f for b, f in fns.items() if f is not None}
        ms = dict(zip(fns, _medians_ms(list(fns.values()), args.repeats, device)))
        ref_ms, tuned_ms, ext_ms = ms["reference"], ms.get("tuned"), ms["ext"]
        row = {
            "op": op,
            "size": size,
            "device": str(device),
            "threads": torch.get_num_threads(),
            "repeats": args.repeats,
            "reference_ms": round(ref_ms, 3),
            "tuned_ms": None if tuned_ms is None else round(tuned_ms, 3),
            "ext_ms": round(ext_ms, 3),
            "speedup_vs_reference": round(ref_ms / ext_ms, 2),
            "speedup_vs_tuned": None if tuned_ms is None else round(tuned_ms / ext_ms, 2),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(_table(rows), file=sys.stderr)
    if args.splat:  # the splat compositor rows too (naive vs tiled vs reference)
        from experiments import splat_bench

        splat_bench.main(["--device", args.device, "--repeats", str(args.repeats)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
