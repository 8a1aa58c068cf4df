"""Splat variants side by side on this CPU (issue 29): default densification vs MCMC, with and
without the antialiasing filter (and per-image appearance compensation where the config has
it), on the synthetic exact-ground-truth scene and the capture-like scene (an object on a table
in a room, phone photos through a distorting lens, posed; experiments/capture_scene.py).

    python -m experiments.splat_table [--budget 60] [--size 64] \
        [--scenes synthetic,capture,capture-exposure] \
        [--variants default,default+aa,mcmc,mcmc+aa,default+app,mcmc+app]

Each run trains in-process with the worker's own intake and trainer for `--budget` seconds of
training, the schedule following that budget as a job's does (worker/jobs/scene.py), from the
job's default config (3000 steps, random start for these posed uploads), then scores the
held-out views as the job does and writes the three export files. Prints a markdown table:
held-out PSNR / SSIM, Gaussians, steps, training seconds, PLY / .splat / .spz bytes.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

VARIANTS = {
    "default": {},
    "default+aa": {"antialiased": True},
    "mcmc": {"strategy": "mcmc"},
    "mcmc+aa": {"strategy": "mcmc", "antialiased": True},
    "default+app": {"appearance": True},
    "mcmc+app": {"strategy": "mcmc", "appearance": True},
}


def scene_zip(name: str, tmp: Path, size: int) -> Path:
    """synthetic: the exact-ground-truth objects (RGBA, size px square, 40 + 8 views); capture:
    the posed capture-like scene (size x 16/9 px portrait, 32 photos, every 8th held out);
    capture-exposure: the same with each photo's exposure scaled by 0.7-1.3 (auto exposure)."""
    path = tmp / f"{name}.zip"
    if name == "synthetic":
        from experiments.synthetic_scene import make_scene

        make_scene(path, size, 40, 8)
        return path
    from experiments.capture_scene import capture_files, zip_bytes

    files = capture_files(32, size, round(size * 16 / 9), supersample=1)["posed"]
    if name == "capture-exposure":
        rng = np.random.default_rng(0)
        for k in sorted(files):
            if k.endswith(".jpg"):
                im = np.asarray(Image.open(io.BytesIO(files[k])).convert("RGB"), np.float64)
                buf = io.BytesIO()
                out = np.clip(im * rng.uniform(0.7, 1.3), 0, 255).round().astype(np.uint8)
                Image.fromarray(out).save(buf, "JPEG", quality=92)
                files[k] = buf.getvalue()
    path.write_bytes(zip_bytes(files))
    return path


def run(upload: Path, overrides: dict, budget: float, tmp: Path) -> dict:
    from core.settings import get_settings
    from service.intake.splat import validate_upload
    from worker.exports.splat_files import splat_bytes
    from worker.exports.spz import spz_bytes
    from worker.jobs.splat import evaluate
    from worker.scene.dataset import Dataset, read_meta
    from worker.scene.pinhole import to_pinhole
    from worker.splat.ply import ply_bytes
    from worker.splat.trainer import SplatTrainer

    job = Path(tempfile.mkdtemp(dir=tmp))
    (job / "upload").mkdir(parents=True)
    config, _ = validate_upload(upload, upload.name, dict(overrides), job, get_settings())
    meta = read_meta(job / "dataset")

    # as SplatJob.dataset: photos through a distorting lens resampled to pinhole cameras
    train = to_pinhole(Dataset(job / "dataset", "train", meta))
    test = to_pinhole(Dataset(job / "dataset", "test", meta))
    trainer = SplatTrainer(config, meta, torch.device("cpu"), train, job / "dataset")
    trainer.lr_horizon_s = budget  # the schedule follows the budget, as in a job
    t0 = time.monotonic()
    while trainer.step < config["steps"] and time.monotonic() - t0 < budget:
        trainer.budget_used_s = time.monotonic() - t0
        trainer.train_step()
    m, _ = evaluate(trainer, test)
    norm = meta["normalization"]
    return {
        "psnr": m["test_psnr"],
        "ssim": m["test_ssim"],
        "n": trainer.n,
        "steps": trainer.step,
        "train_s": trainer.train_s,
        "ply": len(ply_bytes(trainer.params, norm, trainer.antialiased)),
        "splat": len(splat_bytes(trainer.params, norm)[0]),
        "spz": len(spz_bytes(trainer.params, norm, trainer.antialiased)[0]),
        **trainer.counts,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=60.0, help="training seconds per run")
    ap.add_argument("--scenes", default="synthetic,capture")
    ap.add_argument("--variants", default="default,default+aa,mcmc,mcmc+aa")
    ap.add_argument("--config", default="{}", help="JSON overrides for every run")
    ap.add_argument("--size", type=int, default=64, help="image width of the scenes")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    common = json.loads(a.config)
    print(
        "| scene | variant | test PSNR dB | test SSIM | Gaussians | steps | train s "
        "| PLY MB | .splat MB | .spz MB |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for scene in a.scenes.split(","):
            upload = scene_zip(scene, tmp, a.size)
            for v in a.variants.split(","):
                r = run(upload, {**common, **VARIANTS[v]}, a.budget, tmp)
                print(
                    f"| {scene} | {v} | {r['psnr']:.2f} | {r['ssim']:.3f} | {r['n']} | "
                    f"{r['steps']} | {r['train_s']:.0f} | {r['ply'] / 1e6:.2f} | "
                    f"{r['splat'] / 1e6:.2f} | {r['spz'] / 1e6:.2f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
