"""Where a nerf job's time budget goes, and a frame of any size, through the real API and a real
worker (issue 25): trains the synthetic scene (photos of `--size` pixels, 44 training and 7
held-out views, as a capture's every-8th split) with the default config and budget, prints the
job's own accounting (train / curve / checkpoint / evaluation shares, evaluation scale and views),
then asks for a `--width` x `--height` frame (1080x1920 by default), which the API answers as a
render job (202), and prints how long it took to have it.

    python -m experiments.budget_shares [--size 400] [--time-limit 300] [--width 1080 --height 1920]
        [--config '{"occupancy_warmup_steps": 16}']

Timings depend on the machine's load: say what else ran."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from experiments.synthetic_scene import FOV_X_DEG
from tests.support.scenes import decode, scene_upload
from tests.support.stack import new_stack


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=400)
    ap.add_argument("--time-limit", type=float, default=None, help="default: the CPU's 300 s")
    ap.add_argument("--config", type=json.loads, default={}, help="job config overrides (JSON)")
    ap.add_argument("--width", type=int, default=1080)
    ap.add_argument("--height", type=int, default=1920)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        stack = new_stack(Path(tmp), env={"TORCH_THREADS": "2"})
        try:
            scene = scene_upload(args.size, 44, 7)
            config = {**args.config}
            if args.time_limit:
                config["time_limit_s"] = args.time_limit
            r = stack.submit(
                scene["zip"],
                "scene.zip",
                kind="nerf",
                config=config,
                content_type="application/zip",
            )
            r.raise_for_status()
            job_id = r.json()["id"]
            t0 = time.monotonic()
            job = stack.wait_status(job_id, "succeeded", "failed", timeout=3600)
            wall = time.monotonic() - t0
            m = job["metrics"]
            keys = (
                "test_psnr",
                "test_ssim",
                "test_colour_ratio",
                "n_test",
                "eval_views",
                "eval_scale",
                "steps",
                "train_s",
                "curve_s",
                "checkpoint_s",
                "eval_s",
                "time_limit_s",
                "budget_used_s",
                "budget_shares",
                "render_pixels_per_s",
            )
            print(json.dumps({k: m.get(k) for k in keys}, indent=1))
            print(f"job wall time from submission: {wall:.1f} s (status {job['status']})")
            print(f"load average after training: {os.getloadavg()}")
            body = {
                "width": args.width,
                "height": args.height,
                "camera": {"c2w": scene["test_c2w"][0]},
                "fov_x_deg": FOV_X_DEG,
            }
            t0 = time.monotonic()
            r = stack.client.post(f"/v1/jobs/{job_id}/render", json=body)
            print(f"render {args.width}x{args.height}: HTTP {r.status_code}")
            if r.status_code == 202:
                state = r.json()
                while state["status"] not in ("succeeded", "failed"):
                    time.sleep(1.0)
                    state = stack.client.get(state["url"]).json()
                r = stack.client.get(state["artifact_url"]) if state["artifact_url"] else r
                print(f"render job {state['status']} {state.get('error') or ''}")
            if r.status_code == 200:
                print(f"frame {decode(r.content).size} after {time.monotonic() - t0:.1f} s")
                print(f"load average after the render: {os.getloadavg()}")
        finally:
            stack.stop()
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
