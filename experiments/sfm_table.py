"""Posed vs unposed vs video on one scene, through the real service (API, Celery workers on the
train, render and preprocess queues, pycolmap): registered share, SfM seconds, pose error and
held-out test PSNR/SSIM on this machine.

The capture is experiments/sfm_capture.py's textured scene on a video-like loop; held-out true
poses (never uploaded) are rendered by each job through the render API, the SfM frame aligned
to the true one by a similarity fitted to the camera centres (for evaluation only).

    python -m experiments.sfm_table [--frames 32 --size 200 --steps 1000 --threads 1]
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

import numpy as np
from skimage.metrics import structural_similarity

from experiments.sfm_capture import align, make_capture, pose_errors, psnr, render_held_out
from tests.support.stack import stack_maker


class _Tmp:
    """The tmp_path_factory the stack helper expects, over one temporary folder."""

    def __init__(self, root: Path):
        self.root, self.n = root, 0

    def mktemp(self, name: str) -> Path:
        self.n += 1
        p = self.root / f"{name}{self.n}"
        p.mkdir()
        return p


def nerf_config(steps: int) -> dict:
    """The small NeRF of tests/worker/test_sfm_job.py, trained longer: sized for a shared 2-core
    CPU; what is compared is the poses, not the field."""
    return {
        "steps": steps,
        "samples_per_step": 8192,
        "max_rays_per_step": 2048,
        "log2_hashmap_size": 15,
        "n_levels": 12,
        "max_resolution": 512,
        "occupancy_resolution": 32,
        "max_samples_per_ray": 192,
        "n_test_renders": 0,
        "checkpoint_every": 100_000,
        "background": "black",
        "train_background": "black",
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=32, help="photos in the capture")
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--test", type=int, default=6, help="held-out poses")
    ap.add_argument("--steps", type=int, default=1000, help="NeRF training steps (each job)")
    ap.add_argument("--threads", type=int, default=1, help="SFM_THREADS and TORCH_THREADS")
    ap.add_argument("--repeat", type=int, default=3, help="video frames per capture photo")
    a = ap.parse_args(argv)

    t0 = time.perf_counter()
    cap = make_capture(a.frames, a.size, n_test=a.test)
    print(
        f"capture: {a.frames} views + {a.test} held out at {a.size}x{a.size} "
        f"({time.perf_counter() - t0:.0f} s to render)",
        flush=True,
    )
    uploads = {
        "posed": (cap.posed_zip(), "posed.zip", lambda p: int(re.search(r"IMG_(\d+)", p)[1])),
        "unposed": (cap.photos_zip(), "photos.zip", lambda p: int(re.search(r"IMG_(\d+)", p)[1])),
        "video": (
            cap.video(repeat=a.repeat),
            "walk.mp4",
            lambda p: int(re.search(r"frame_(\d+)", p)[1]) // a.repeat,
        ),
    }
    env = {
        "SFM_THREADS": str(a.threads),
        "TORCH_THREADS": str(a.threads),
        "SFM_NUM_FRAMES_TARGET": str(a.frames),
        "TRAIN_LONG_SIDE": str(a.size),
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp, stack_maker(_Tmp(Path(tmp))) as make:
        stack = make("train,render,preprocess", env=env)
        for name, (data, filename, index_of) in uploads.items():
            t = time.perf_counter()
            r = stack.submit(data, filename, kind="nerf", config=nerf_config(a.steps))
            r.raise_for_status()
            job = stack.wait_status(r.json()["id"], "succeeded", "failed", timeout=7200)
            wall = time.perf_counter() - t
            if job["status"] != "succeeded":
                print(f"{name}: {job['error']}")
                continue
            ds = job["dataset"]
            sim, rot, centre = None, 0.0, 0.0
            if name != "posed":
                tf = stack.client.get(f"/v1/jobs/{job['id']}/artifacts/transforms.json").json()
                est, true, sim = align(tf, cap, index_of)
                rot, centre = pose_errors(est, true, sim)
            preds = render_held_out(stack.client, job["id"], cap, sim)
            gts = [g.astype(np.float64) / 255 for g in cap.test_rgb]
            rows.append(
                {
                    "name": name,
                    "n": ds.get("n_images", ds["n_train"] + ds["n_test"]),
                    "reg": ds.get("n_registered", ds["n_train"] + ds["n_test"]),
                    "sfm_s": ds.get("sfm_s"),
                    "rot": rot,
                    "centre": centre,
                    "psnr": float(np.mean([psnr(p, g) for p, g in zip(preds, cap.test_rgb)])),
                    "ssim": float(
                        np.mean(
                            [
                                structural_similarity(p, g, channel_axis=2, data_range=1.0)
                                for p, g in zip(preds, gts)
                            ]
                        )
                    ),
                    "job_psnr": job["metrics"]["test_psnr"],
                    "wall": wall,
                }
            )
            print(f"{name}: done in {wall:.0f} s", flush=True)

    print()
    print(
        f"{a.frames} views at {a.size}x{a.size}, {a.steps} NeRF steps, {a.threads} threads; "
        f"PSNR/SSIM on {a.test} held-out true poses"
    )
    head = (
        f"{'upload':<8} {'registered':>12} {'SfM s':>6} {'rot err':>8} {'centre':>7} "
        f"{'PSNR':>6} {'SSIM':>6} {'job PSNR':>9} {'wall s':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        share = f"{r['reg']}/{r['n']} {r['reg'] / r['n']:.0%}"
        sfm = "-" if r["sfm_s"] is None else f"{r['sfm_s']:.1f}"
        rot = "-" if r["name"] == "posed" else f"{r['rot']:.2f}°"
        centre = "-" if r["name"] == "posed" else f"{r['centre']:.2%}"
        print(
            f"{r['name']:<8} {share:>12} {sfm:>6} {rot:>8} {centre:>7} {r['psnr']:>6.2f} "
            f"{r['ssim']:>6.3f} {r['job_psnr']:>9.2f} {r['wall']:>7.0f}"
        )
    print("-" * len(head))
    posed = next((r for r in rows if r["name"] == "posed"), None)
    if posed is not None:
        for r in rows:
            if r is not posed:
                print(f"{r['name']}: {r['psnr'] - posed['psnr']:+.2f} dB against posed")


if __name__ == "__main__":
    main()
