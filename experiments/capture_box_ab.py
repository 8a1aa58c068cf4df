"""The scene box on the capture-like scene (experiments/capture_scene.py), side by side in one
process: the unit box (what an upload without aabb_scale got before), a large box with one
occupancy cascade (what an upload with aabb_scale got before), and the large box with cascades.

Each variant trains the posed upload for the same number of steps (a step horizon: the learning
rate decays over the steps, so the result does not depend on machine load) with the default
config, then renders every held-out photo; prints test PSNR/SSIM, seconds a step, samples per
ray and the share of occupancy cells marked unseen.

    python -m experiments.capture_box_ab [--steps 400 --box 8 --threads 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import worker.nerf.trainer as trainer_mod
from api_schemas.nerf import NerfConfig
from core.settings import Settings
from experiments.capture_scene import capture_files, zip_bytes
from worker.nerf.rendering import render_image
from worker.scene.dataset import Dataset, read_meta
from worker.scene.metrics import psnr, ssim


def held_out(trainer, test: Dataset, meta: dict, root: Path) -> tuple[float, float]:
    trainer.field.eval()
    ps, ss = [], []
    files = [f["file"] for f in meta["frames"] if f["split"] == "test"]
    for i, f in enumerate(test.frames):
        o, d = test.frame_rays(i)
        rgb, _, _, _ = render_image(
            trainer.field,
            trainer.grid,
            o,
            d,
            trainer.eval_background,
            step=trainer.step_size,
            cone_angle=trainer.config.cone_angle,
            max_samples=trainer.config.max_samples_per_ray,
            max_step=trainer.max_step,
        )
        pred = rgb.clamp(0, 1).reshape(f.h, f.w, 3).numpy()
        gt = np.asarray(Image.open(root / files[i]).convert("RGB"), dtype=np.float32) / 255
        ps.append(psnr(pred, gt))
        ss.append(ssim(pred, gt))
    return float(np.mean(ps)), float(np.mean(ss))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument(
        "--box",
        type=int,
        default=None,
        help="aabb_scale of the large-box variants (default: chosen)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--views", type=int, default=50)
    ap.add_argument("--width", type=int, default=180)
    ap.add_argument("--height", type=int, default=320)
    ap.add_argument(
        "--variants", default="unit,one-cascade,cascades", help="subset, comma-separated"
    )
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from service.intake.nerf import validate_upload

    tmp = Path(tempfile.mkdtemp(prefix="capture_ab_"))
    job = tmp / "job"
    (job / "upload").mkdir(parents=True)
    (job / "upload" / "c.zip").write_bytes(
        zip_bytes(capture_files(a.views, a.width, a.height)["posed"])
    )
    validate_upload(job / "upload" / "c.zip", "c.zip", {}, job, Settings(data_dir=tmp))
    root = job / "dataset"
    meta = read_meta(root)
    data, test = Dataset(root, "train", meta), Dataset(root, "test", meta)
    print(
        f"dataset: box chosen {meta['aabb'][1][0]}, {len(data.frames)} train, {len(test.frames)} test"
    )
    big = a.box or int(meta["aabb"][1][0])
    layout = trainer_mod.grid_layout
    variants = {
        "unit": (1, layout),
        "one-cascade": (big, lambda half: (half, 1)),
        "cascades": (big, layout),
    }
    print(
        "| box | cascades | steps | s/step | samples/ray | unseen cells | test PSNR | test SSIM |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in a.variants.split(","):
        box, lay = variants[name]
        trainer_mod.grid_layout = lay
        try:
            cfg = NerfConfig(steps=a.steps, aabb_scale=box).model_dump(mode="json")
            t = trainer_mod.NerfTrainer(cfg, meta, "cpu", data)
        finally:
            trainer_mod.grid_layout = layout
        spr = []
        t0 = time.perf_counter()
        for _ in range(a.steps):
            out = t.train_step()
            spr.append(out["samples_per_ray"])
        dt = (time.perf_counter() - t0) / a.steps
        p, s = held_out(t, test, meta, root)
        print(
            f"| {box} | {t.grid.n_cascades} | {a.steps} | {dt:.3f} | "
            f"{np.mean(spr[-a.steps // 4 :]):.1f} | {t.unseen_fraction:.0%} | {p:.2f} | {s:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
