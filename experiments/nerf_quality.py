"""Quality bar for kind=nerf: a synthetic scene with exact ground truth, trained over HTTP.

Generates the scene (numpy ray-traced, RGBA, Blender convention), uploads it to a real stack
(uvicorn + a Celery worker started here as subprocesses, or `--url` of a running one), trains once
with the compiled kernels (backend=ext) and once with the pure-torch references, renders the
held-out poses through POST /render, and prints a table: test PSNR/SSIM, training time, and the
training time each backend needed to reach the same PSNR levels (from the test-PSNR curve the job
records every 30 s of training).

    python -m experiments.nerf_quality [--url URL] [--budget-s 780] [--reference-budget-s 600]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import tempfile
import time
import zipfile
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from experiments.synthetic_scene import FOV_X_DEG, scene_files

# CPU settings: a 64^3 occupancy grid and ~256 steps across the box are plenty for 100x100 views
# (a pixel spans ~0.02 normalised units, a step 0.0135); the network is the (16 levels,
# F=2, 64-wide MLPs) with the default table for its 6e5 training pixels (2^17 rows per level).
CPU_CONFIG = {
    "occupancy_resolution": 64,
    "max_samples_per_ray": 256,
    "steps": 4000,
    "n_test_renders": 4,
    "checkpoint_every": 100000,
}
LEVELS = (15.0, 18.0, 20.0, 22.0, 24.0, 25.0, 26.0)


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a - b) ** 2))
    return float("inf") if mse <= 0 else -10 * math.log10(mse)


def _on_white(png: bytes) -> np.ndarray:
    rgba = np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"), dtype=np.float64) / 255
    return rgba[..., :3] * rgba[..., 3:] + (1 - rgba[..., 3:])


def train_job(client: httpx.Client, data: bytes, config: dict, label: str) -> dict:
    r = client.post(
        "/v1/jobs",
        data={"kind": "nerf", "config": json.dumps(config)},
        files={"dataset": ("scene.zip", data, "application/zip")},
    )
    r.raise_for_status()
    job_id = r.json()["id"]
    t0, last_print = time.monotonic(), 0.0
    while True:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            break
        if time.monotonic() - last_print > 30:
            p = job["progress"]
            print(
                f"  [{label}] {time.monotonic() - t0:6.0f}s wall  step {p['step']}  train psnr "
                f"{p.get('psnr') or 0:.2f}  rays/s {p.get('rays_per_s') or 0:.0f}  samples/ray "
                f"{p.get('samples_per_ray') or 0:.1f}",
                flush=True,
            )
            last_print = time.monotonic()
        time.sleep(2)
    if job["status"] != "succeeded":
        raise RuntimeError(f"{label} job {job_id} {job['status']}: {job.get('error')}")
    created = datetime.fromisoformat(job["created_at"].replace("Z", "+00:00"))
    updated = datetime.fromisoformat(job["updated_at"].replace("Z", "+00:00"))
    job["wall_s"] = (updated - created).total_seconds()
    return job


def time_to(curve: list[dict], level: float) -> float | None:
    """Training seconds at the first curve point at or above `level` (None: never reached)."""
    for pt in curve:
        if pt["test_psnr"] >= level:
            return pt["train_s"]
    return None


def http_test_psnr(client: httpx.Client, job_id: str, files: dict[str, bytes], size: int) -> float:
    test = json.loads(files["transforms_test.json"])
    scores = []
    for i, fr in enumerate(test["frames"]):
        r = client.post(
            f"/v1/jobs/{job_id}/render",
            json={
                "width": size,
                "height": size,
                "fov_x_deg": FOV_X_DEG,
                "camera": {"c2w": fr["transform_matrix"]},
            },
        )
        r.raise_for_status()
        img = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"), dtype=np.float64) / 255
        scores.append(_psnr(img, _on_white(files[f"test/r_{i}.png"])))
    return float(np.mean(scores))


def _fmt_t(t: float | None, budget: float) -> str:
    return f"{t:.0f}s" if t is not None else f">{budget:.0f}s"


def report(results: dict[str, dict], budgets: dict[str, float], http_psnr: float | None) -> str:
    lines = [
        "| backend | steps | train time | wall time | test PSNR | test SSIM | "
        + " | ".join(f"to {lv:g} dB" for lv in LEVELS)
        + " |",
        "|---|---|---|---|---|---|" + "---|" * len(LEVELS),
    ]
    for be, job in results.items():
        m = job["metrics"]
        cells = [_fmt_t(time_to(m["curve"], lv), m["train_s"]) for lv in LEVELS]
        lines.append(
            f"| {be} | {m['steps']} | {m['train_s']:.0f}s | {job['wall_s']:.0f}s | {m['test_psnr']:.2f} | "
            f"{m['test_ssim']:.3f} | " + " | ".join(cells) + " |"
        )
    if "ext" in results and "reference" in results:
        ce, cr = results["ext"]["metrics"]["curve"], results["reference"]["metrics"]["curve"]
        ratios = []
        for lv in LEVELS:
            te, tr = time_to(ce, lv), time_to(cr, lv)
            if te and tr:
                ratios.append(f"{tr / te:.1f}x")
            elif te and not tr:
                ratios.append(f">{results['reference']['metrics']['train_s'] / te:.1f}x")
            else:
                ratios.append("-")
        lines.append("| reference / ext | | | | | | " + " | ".join(ratios) + " |")
    base = next(iter(results.values()))["metrics"]["background_psnr"]
    lines.append("")
    lines.append(
        f"background-only baseline PSNR: {base:.2f} dB; times are training seconds (evaluation and "
        "checkpoint pauses excluded), at the first curve point (every 30 training seconds) whose "
        "test PSNR reached the level"
    )
    if http_psnr is not None:
        lines.append(
            f"ext: renders of the {results['ext']['metrics']['n_test']} held-out poses through "
            f"POST /render: mean PSNR {http_psnr:.2f} dB vs the held-out photos"
        )
    lines.append(
        "budgets (train seconds): " + ", ".join(f"{k} {v:.0f}s" for k, v in budgets.items())
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--url",
        help="a running service (its worker's CHECKPOINT_INTERVAL_S sets the curve spacing)",
    )
    ap.add_argument(
        "--key", default=os.environ.get("NF_API_KEY"), help="API key for --url (env NF_API_KEY)"
    )
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--train", type=int, default=60)
    ap.add_argument("--test", type=int, default=10)
    ap.add_argument(
        "--budget-s", type=float, default=780, help="training-time limit of the ext run"
    )
    ap.add_argument("--reference-budget-s", type=float, default=420)
    ap.add_argument("--skip-reference", action="store_true")
    ap.add_argument("--checkpoint-interval-s", type=float, default=120)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args(argv)

    files = scene_files(a.size, a.train, a.test)
    data = _zip(files)
    print(
        f"scene: {a.train} train + {a.test} test views, {a.size}x{a.size} RGBA ({len(data) / 1e6:.1f} MB zip)"
    )
    stack = None
    tmp = tempfile.TemporaryDirectory(prefix="nerf_quality_")
    url, key = a.url, a.key
    if url is None:
        from tests.support.stack import TEST_KEY, new_stack

        env = {
            "TORCH_THREADS": "2",
            "CHECKPOINT_INTERVAL_S": str(a.checkpoint_interval_s),
            "RENDER_TIMEOUT_S": "300",
        }
        stack = new_stack(Path(tmp.name), env=env)
        url, key = stack.base_url, TEST_KEY
        print(f"stack at {url} (logs in {tmp.name})")
    try:
        client = httpx.Client(
            base_url=url, timeout=600, headers={"Authorization": f"Bearer {key}"} if key else None
        )
        budgets = {"ext": a.budget_s} | (
            {} if a.skip_reference else {"reference": a.reference_budget_s}
        )
        results = {}
        for be, budget in budgets.items():
            cfg = {**CPU_CONFIG, "backend": be, "time_limit_s": budget}
            print(
                f"training backend={be} (time limit {budget:.0f}s) config {json.dumps(cfg)}",
                flush=True,
            )
            results[be] = train_job(client, data, cfg, be)
            m = results[be]["metrics"]
            print(
                f"  -> test PSNR {m['test_psnr']:.2f} dB, SSIM {m['test_ssim']:.3f}, {m['steps']} steps, "
                f"{m['train_s']:.0f}s training, {results[be]['wall_s']:.0f}s wall; curve {m['curve']}",
                flush=True,
            )
        http_psnr = http_test_psnr(client, results["ext"]["id"], files, a.size)
        table = report(results, budgets, http_psnr)
        print()
        print(table)
        if a.json_out:
            a.json_out.write_text(
                json.dumps({"results": results, "http_psnr": http_psnr}, indent=1, default=str)
            )
        return 0 if results["ext"]["metrics"]["test_psnr"] >= 25 else 1
    finally:
        if stack is not None:
            stack.stop()
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
