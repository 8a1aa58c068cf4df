"""Held-out quality on a capture-like scene (experiments/capture_scene.py: an object on a table in
a room, phone photos through a distorting lens), posed and unposed, kind nerf and kind splat,
through the real service with its default config and a time budget.

Prints one row per job: held-out PSNR/SSIM (the job's own metrics over its test split, every 8th
photo), the box the dataset got, share of the job's wall time that was training steps, samples
per ray (nerf), SfM seconds. `--repo` runs the service of another checkout (e.g. a
`git worktree add /tmp/before f947d5a`), so the same script measures before and after:

    python -m experiments.capture_table --budget 300 [--repo /tmp/before] [--runs nerf:posed,...]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from experiments.capture_scene import capture_files, zip_bytes

RUNS = "nerf:posed,nerf:unposed,nerf:object,splat:posed,splat:unposed"


def run_job(
    stack, kind: str, data: bytes, budget: float, timeout: float, extra: dict | None = None
) -> dict:
    t0 = time.monotonic()
    config = {**(extra or {}), "time_limit_s": budget}
    r = stack.submit(data, "capture.zip", kind=kind, config=config)
    r.raise_for_status()
    job_id = r.json()["id"]
    spr: list[float] = []
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = stack.client.get(f"/v1/jobs/{job_id}").json()
        p = job.get("progress") or {}
        if p.get("samples_per_ray") is not None:
            spr.append(float(p["samples_per_ray"]))
        if job["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(1.0)
    job["wall_s"] = time.monotonic() - t0
    job["samples_per_ray_seen"] = spr
    return job


def row(label: str, kind: str, upload: str, budget: float, job: dict) -> dict:
    m = job.get("metrics") or {}
    ds = job.get("dataset") or {}
    used = m.get("budget_used_s") or 0.0
    spr = job["samples_per_ray_seen"]
    return {
        "code": label,
        "kind": kind,
        "upload": upload,
        "budget_s": budget,
        "status": job["status"],
        "error": job.get("error"),
        "test_psnr": m.get("test_psnr"),
        "test_ssim": m.get("test_ssim"),
        "n_test": m.get("n_test"),
        "background_psnr": m.get("background_psnr"),
        "train_s": m.get("train_s"),
        "budget_used_s": used,
        "train_share": (m.get("train_s") or 0.0) / used if used else None,
        "steps": m.get("steps"),
        # the last quarter of the run's progress reports: where the grid has settled
        "samples_per_ray": sum(spr[-max(1, len(spr) // 4) :])
        / max(1, len(spr[-max(1, len(spr) // 4) :]))
        if spr
        else None,
        "aabb_scale": ds.get("aabb_scale"),
        "n_registered": ds.get("n_registered"),
        "sfm_s": ds.get("sfm_s"),
        "wall_s": round(job["wall_s"], 1),
    }


def fmt(r: dict) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    return (
        f"| {r['code']} | {r['kind']} | {r['upload']} | {r['budget_s']:.0f} | "
        f"{f(r['test_psnr'], '.2f')} | {f(r['test_ssim'], '.3f')} | {f(r['n_test'], 'd')} | "
        f"{f(r['background_psnr'], '.2f')} | {f(r['train_share'], '.0%')} | "
        f"{f(r['samples_per_ray'], '.1f')} | {f(r['aabb_scale'], '')} | {f(r['sfm_s'], '.0f')} | "
        f"{r['wall_s']:.0f} | {r['status']} |"
    )


HEADER = (
    "| code | kind | upload | budget s | test PSNR | test SSIM | views | white-only PSNR | "
    "training share | samples/ray | box | SfM s | job wall s | status |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=None, help="checkout whose service runs")
    ap.add_argument("--label", default=None, help="the code column (default: the repo's name)")
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument("--runs", default=RUNS, help="kind:upload,... (upload: posed|unposed|object)")
    ap.add_argument("--views", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2, help="TORCH_THREADS of the worker")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument(
        "--nerf-config",
        type=json.loads,
        default=None,
        help="JSON config fields added to the nerf jobs' (e.g. '{\"max_samples_per_ray\": 256}')",
    )
    a = ap.parse_args(argv)

    import tests.support.stack as stack_mod

    repo = (a.repo or stack_mod.REPO).resolve()
    label = a.label or repo.name
    t0 = time.perf_counter()
    uploads = {k: zip_bytes(v) for k, v in capture_files(a.views).items()}
    print(f"capture: {a.views} views, made in {time.perf_counter() - t0:.0f}s", flush=True)
    stack_mod.REPO = repo  # the processes run the other checkout's code
    kernels = os.environ.get("KERNELS_BUILD_DIR") or str(
        Path(__file__).resolve().parents[1] / ".kernels-build"
    )
    env = {
        "PYTHONPATH": str(repo),
        "TORCH_THREADS": str(a.threads),
        "KERNELS_BUILD_DIR": kernels,  # same sources, same compiled kernels
        "RENDER_TIMEOUT_S": "300",
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="capture_table_") as tmp:
        stack = stack_mod.new_stack(Path(tmp), "train,render,preprocess", env=env)
        stack._client = httpx.Client(base_url=stack.base_url, timeout=120, headers=stack.headers)
        try:
            print(HEADER, flush=True)
            for spec in a.runs.split(","):
                kind, upload = spec.split(":")
                job = run_job(
                    stack,
                    kind,
                    uploads[upload],
                    a.budget,
                    timeout=4 * a.budget + 900,
                    extra=a.nerf_config if kind == "nerf" else None,
                )
                r = row(label, kind, upload, a.budget, job)
                rows.append(r)
                print(fmt(r), flush=True)
                if r["error"]:
                    print(f"   error: {r['error']}", flush=True)
        finally:
            stack.stop()
    if a.json_out:
        a.json_out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
