"""Held-out quality on real and standard captures through the real service, default config.

Runs instant-ngp's fox (`../shared/captures/fox`: posed, the folder zipped as it is; photos-only,
`images/*.jpg` alone, poses by SfM) as nerf and splat jobs, and the NeRF synthetic lego scene
(400 px, `../shared/captures/lego`, its own train/test split, on white), each with a time budget
and nothing else in its config, on a stack like `make run`'s (API + a Celery worker on every
queue, CPU photos at a 400-px long side unless `--long-side`). Prints one row per job: held-out
PSNR/SSIM over every held-out view (the job's metrics, at the scale `eval_scale` says), the
PSNR of each view, train PSNR, steps, wall time, training share of the budget, samples per ray.

    python -m experiments.real_captures [--budget 300] [--runs nerf:fox-posed,...] [--artifacts DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import httpx

from experiments.capture_table import run_job, save_images

CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "captures"
RUNS = "nerf:fox-posed,splat:fox-posed,nerf:fox-photos,splat:fox-photos,nerf:lego,splat:lego"
# Published held-out figures beside ours (docs/nerf.md): the methods' own papers and repositories.
ANCHORS = {
    "lego": "instant-ngp 36.39 dB (800 px, 5 min, RTX 3090); 3DGS ~35.8 dB",
    "fox-posed": "no published held-out figure (instant-ngp's demo scene)",
}


def upload(name: str) -> tuple[bytes, str]:
    """(zip bytes, file name) of an upload: fox-posed, fox-photos or lego."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        if name == "fox-posed":
            src = CAPTURES / "fox"
            for p in sorted(src.rglob("*")):
                if p.is_file():
                    zf.write(p, p.relative_to(src).as_posix())
        elif name == "fox-photos":
            for p in sorted((CAPTURES / "fox" / "images").glob("*.jpg")):
                zf.write(p, f"images/{p.name}")
        elif name == "lego":
            src = CAPTURES / "lego"
            for p in sorted(src.rglob("*")):
                if p.is_file():
                    zf.write(p, p.relative_to(src).as_posix())
        else:
            raise SystemExit(f"unknown upload {name!r}")
    return buf.getvalue(), f"{name}.zip"


def views_of(stack, job_id: str) -> list[float]:
    r = stack.client.get(f"/v1/jobs/{job_id}/artifacts/results.json", follow_redirects=True)
    if r.status_code != 200:
        return []
    return [v.get("psnr") for v in r.json().get("views", [])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--runs", default=RUNS, help="kind:upload,... (fox-posed|fox-photos|lego)")
    ap.add_argument("--threads", type=int, default=2, help="TORCH_THREADS of the worker")
    ap.add_argument("--long-side", type=int, default=400, help="TRAIN_LONG_SIDE (make run's CPU)")
    ap.add_argument("--config", type=json.loads, default=None, help="JSON added to every config")
    ap.add_argument("--artifacts", type=Path, default=None, help="keep each job's renders here")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="the service's DATA_DIR, kept after the run (jobs' datasets for experiments.fox_dev "
        "--dataset); default a temporary one",
    )
    a = ap.parse_args(argv)

    import tests.support.stack as stack_mod

    # SIGTERM as an exception, so `finally` stops the service and worker this run started
    # (the default action ends the process at once and leaves them running, reparented).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    kernels = os.environ.get("KERNELS_BUILD_DIR") or str(stack_mod.REPO / ".kernels-build")
    env = {
        "TORCH_THREADS": str(a.threads),
        "KERNELS_BUILD_DIR": kernels,
        "TRAIN_LONG_SIDE": str(a.long_side),
        "RENDER_TIMEOUT_S": "300",
    }
    rows = []
    print(
        "| kind | upload | budget s | test PSNR | SSIM | eval scale | views (dB) | train PSNR | "
        "steps | train share | samples/ray | job wall s | status |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="real_captures_") as tmp:
        if a.data_dir is not None:
            a.data_dir.mkdir(parents=True, exist_ok=True)
        root = a.data_dir or Path(tmp)
        stack = stack_mod.new_stack(root, "train,render,preprocess", env=env)
        stack._client = httpx.Client(base_url=stack.base_url, timeout=120, headers=stack.headers)
        try:
            for spec in a.runs.split(","):
                kind, name = spec.split(":")
                data, _ = upload(name)
                t0 = time.monotonic()
                job = run_job(
                    stack, kind, data, a.budget, timeout=4 * a.budget + 1800, extra=a.config
                )
                m = job.get("metrics") or {}
                spr = job["samples_per_ray_seen"]
                tail = spr[-max(1, len(spr) // 4) :]
                used = m.get("budget_used_s") or 0.0
                r = {
                    "kind": kind,
                    "upload": name,
                    "budget_s": a.budget,
                    "status": job["status"],
                    "error": job.get("error"),
                    "test_psnr": m.get("test_psnr"),
                    "test_ssim": m.get("test_ssim"),
                    "eval_scale": m.get("eval_scale"),
                    "views": views_of(stack, job["id"]),
                    "train_psnr": m.get("train_psnr"),
                    "steps": m.get("steps"),
                    "train_share": (m.get("train_s") or 0.0) / used if used else None,
                    "samples_per_ray": sum(tail) / len(tail) if tail else None,
                    "wall_s": round(time.monotonic() - t0, 1),
                }
                rows.append(r)
                if a.artifacts:
                    save_images(stack, job["id"], a.artifacts / f"{kind}-{name}")

                def f(v, spec):
                    return "-" if v is None else format(v, spec)

                print(
                    f"| {kind} | {name} | {a.budget:.0f} | {f(r['test_psnr'], '.2f')} | "
                    f"{f(r['test_ssim'], '.3f')} | {f(r['eval_scale'], '.2f')} | "
                    + " ".join(f(v, ".1f") for v in r["views"])
                    + f" | {f(r['train_psnr'], '.2f')} | {f(r['steps'], 'd')} | "
                    f"{f(r['train_share'], '.0%')} | {f(r['samples_per_ray'], '.1f')} | "
                    f"{r['wall_s']:.0f} | {r['status']} |",
                    flush=True,
                )
                if r["error"]:
                    print(f"   error: {r['error']}", flush=True)
        finally:
            stack.stop()
    for k, v in ANCHORS.items():
        print(f"anchor {k}: {v}")
    if a.json_out:
        a.json_out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
