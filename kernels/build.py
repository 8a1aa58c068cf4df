"""Build (or load from cache) every compiled kernels backend this machine can run.

    python -m kernels.build [--require-cuda]

Builds every extension (`kernels._ext.EXTENSIONS`: the NeRF ops and the splat compositors). Used by
the worker image at build time so that the first task does not pay for compilation. Prints one
JSON line per backend and exits non-zero when the CPU build (or, with
--require-cuda, the CUDA build) fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def _smoke(device: str) -> None:
    # One tiny call per op, so a module that builds but cannot run fails here rather than in a job.
    import kernels

    dev = torch.device(device)
    g = kernels.HashGrid(3, 4, 2, 14, 16, finest_resolution=64).to(dev)
    g(torch.rand(8, 3, device=dev)).sum().backward()
    kernels.sh_encode(torch.nn.functional.normalize(torch.randn(8, 3, device=dev), dim=-1))
    grid = kernels.OccupancyGrid([-1, -1, -1, 1, 1, 1], resolution=16).to(dev)
    grid.binarize()
    o = torch.tensor([[0.0, 0.0, -3.0]], device=dev)
    s = kernels.march_rays(
        o, torch.tensor([[0.0, 0.0, 1.0]], device=dev), grid, render_step_size=0.1
    )
    sig = torch.ones(s.n_samples, device=dev, requires_grad=True)
    rgb = torch.full((s.n_samples, 3), 0.5, device=dev)
    kernels.composite(sig, rgb, s.t_starts, s.t_ends, s.ray_indices, 1, offsets=s.offsets)[
        0
    ].sum().backward()
    if dev.type == "cpu":  # the fused MLPs have no CUDA build (nn.Linear serves there)
        lin = [torch.nn.Linear(32, 16), torch.nn.Linear(31, 3)]
        layers = [(m.weight, m.bias) for m in lin]
        sigma, rgb = kernels.nerf_mlp(
            torch.rand(8, 32, requires_grad=True), layers[:1], torch.rand(8, 16), layers[1:]
        )
        (sigma.sum() + rgb.sum()).backward()
    means = torch.tensor([[8.0, 8.0]], device=dev, requires_grad=True)
    conics = torch.tensor([[0.1, 0.0, 0.1]], device=dev)
    for method in ("tiled", "naive"):
        rgb, _ = kernels.rasterize(
            means,
            conics,
            torch.ones(1, 3, device=dev),
            torch.full((1,), 0.5, device=dev),
            16,
            16,
            method=method,
        )
        rgb.sum().backward()


def _build(device: str, smoke: bool = True) -> dict:
    from kernels import _ext

    t = time.perf_counter()
    try:
        mods = [_ext.load(ext, device) for ext in _ext.EXTENSIONS]
        if smoke:
            _smoke(device)
    except Exception as exc:  # report, then let main decide the exit status
        return {
            "backend": device,
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}"[:2000],
            "seconds": round(time.perf_counter() - t, 1),
        }
    return {
        "backend": device,
        "ok": True,
        "modules": [getattr(mod, "__file__", str(mod)) for mod in mods],
        "build_dir": str(_ext.build_dir()),
        "seconds": round(time.perf_counter() - t, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--require-cuda", action="store_true", help="fail unless the CUDA extension builds too"
    )
    args = ap.parse_args(argv)
    status = 0
    cpu = _build("cpu")
    print(json.dumps(cpu), flush=True)
    if not cpu["ok"]:
        status = 1
    if torch.version.cuda is not None:
        # `docker build` sees no GPU: compile anyway (set TORCH_CUDA_ARCH_LIST), smoke-test only
        # where a device is visible.
        cuda = _build("cuda", smoke=torch.cuda.is_available())
        cuda["smoke_tested"] = cuda["ok"] and torch.cuda.is_available()
        print(json.dumps(cuda), flush=True)
        if not cuda["ok"]:
            status = 1
    else:
        print(
            json.dumps({"backend": "cuda", "ok": False, "skipped": "torch has no CUDA"}), flush=True
        )
        if args.require_cuda:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
