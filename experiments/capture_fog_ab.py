"""Fog on the capture-like scene: NeRF training variants side by side at equal steps.

Trainers that differ only in their config overrides are built on the same dataset and stepped
in turn (one step of A, one of B, ...; the learning rate decays over the planned steps, so the
result does not depend on machine load), then every held-out photo is rendered (full size, the
variant's own alpha threshold) and scored at each check. Prints held-out PSNR/SSIM, kept and
marched samples per ray (mean over the steps since the last check), rays per step, and each
variant's seconds a step relative to the first (measured interleaved, so load hits all alike).

Scenes: `posed` (experiments/capture_scene.py, the object on a table in a room), `object` (the
same object alone in empty space, same cameras), `synthetic` (experiments/synthetic_scene.py's
quality-bar scene, 100x100, 60 + 10 views, Blender-like). Variants: the names in VARIANTS, or
`name:key=value+key=value` with NerfConfig fields (JSON values).

    python -m experiments.capture_fog_ab --scene posed --width 90 --height 160 --steps 300 \\
        --every 100 --threads 1 --variants cone256,cone64,alpha,dist
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

VARIANTS: dict[str, dict] = {
    "base": {},  # the defaults
    "cone256": {"cone_angle": 1 / 256},  # instant-ngp's cone angle (the GPU default)
    "cone64": {"cone_angle": 1 / 64},  # the CPU default for boxes past the unit cube
    "steps256": {"max_samples_per_ray": 256},
    "alpha": {"alpha_threshold": 0.01},
    "dist": {"distortion_loss": 0.01},
    "alpha+dist": {"alpha_threshold": 0.01, "distortion_loss": 0.01},
}


def parse_variant(spec: str) -> tuple[str, dict]:
    if spec in VARIANTS:
        return spec, VARIANTS[spec]
    name, _, body = spec.partition(":")
    over = {}
    for item in filter(None, body.split("+")):
        k, _, v = item.partition("=")
        over[k] = json.loads(v)
    return name, over


def build_dataset(scene: str, tmp: Path, views: int, width: int, height: int) -> Path:
    from core.settings import Settings
    from service.intake.nerf import validate_upload

    job = tmp / "job"
    (job / "upload").mkdir(parents=True)
    if scene == "synthetic":
        from experiments.synthetic_scene import make_scene

        z = make_scene(tmp / "scene.zip", size=100, n_train=60, n_test=10)
        validate_upload(z, "scene.zip", {}, job, Settings(data_dir=tmp))
    else:
        from experiments.capture_scene import capture_files, zip_bytes

        z = job / "upload" / "c.zip"
        z.write_bytes(zip_bytes(capture_files(views, width, height)[scene]))
        validate_upload(z, "c.zip", {}, job, Settings(data_dir=tmp))
    return job / "dataset"


def held_out(trainer, test) -> tuple[float, float]:
    """Mean PSNR and SSIM over every held-out view, full size."""
    from worker.nerf.rendering import render_image
    from worker.scene.evaluate import ground_truth
    from worker.scene.metrics import psnr, ssim

    trainer.field.eval()
    ps, ss = [], []
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
            alpha_threshold=trainer.config.alpha_threshold,
        )
        pred = rgb.clamp(0, 1).reshape(f.h, f.w, 3).numpy()
        gt = ground_truth(test, i, trainer.eval_background)
        ps.append(psnr(pred, gt))
        ss.append(ssim(pred, gt))
    trainer.field.train()
    return float(np.mean(ps)), float(np.mean(ss))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scene", default="posed", choices=("posed", "object", "synthetic"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--views", type=int, default=50)
    ap.add_argument("--width", type=int, default=90)
    ap.add_argument("--height", type=int, default=160)
    ap.add_argument("--variants", default="cone256,cone64,alpha,dist")
    a = ap.parse_args(argv)

    import torch

    from api_schemas.nerf import NerfConfig
    from worker.nerf.trainer import NerfTrainer
    from worker.scene.dataset import Dataset, read_meta

    torch.set_num_threads(a.threads)
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="capture_fog_ab_") as tmp:
        root = build_dataset(a.scene, Path(tmp), a.views, a.width, a.height)
        meta = read_meta(root)
        train, test = Dataset(root, "train", meta), Dataset(root, "test", meta)
        print(
            f"scene {a.scene}: box {meta['aabb'][1][0]}, {len(train.frames)} train, "
            f"{len(test.frames)} test views",
            flush=True,
        )
        runs, overrides = {}, {}
        for spec in a.variants.split(","):
            name, over = parse_variant(spec)
            cfg = NerfConfig(steps=a.steps, **over).model_dump(mode="json")
            runs[name], overrides[name] = NerfTrainer(cfg, meta, "cpu", train), over
        names = list(runs)
        seconds = dict.fromkeys(names, 0.0)
        acc = {n: {"kept": 0.0, "marched": 0.0, "rays": 0.0, "k": 0} for n in names}
        print(
            "| variant | overrides | step | test PSNR | test SSIM | kept samples/ray | "
            "marched/ray | rays/step | s/step vs first |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        t_start = time.perf_counter()
        for step in range(1, a.steps + 1):
            for n in names:
                out = runs[n].train_step()
                seconds[n] += out["seconds"]
                s = acc[n]
                s["kept"] += out["samples_per_ray"]
                s["marched"] += out["marched_per_ray"]
                s["rays"] += out["rays"]
                s["k"] += 1
            if step % a.every == 0 or step == a.steps:
                for n in names:
                    p, q = held_out(runs[n], test)
                    s = acc[n]
                    k = max(s["k"], 1)
                    print(
                        f"| {n} | {json.dumps(overrides[n])} | {step} | {p:.2f} | {q:.3f} | "
                        f"{s['kept'] / k:.1f} | {s['marched'] / k:.1f} | {s['rays'] / k:.0f} | "
                        f"{seconds[n] / max(seconds[names[0]], 1e-9):.2f} |",
                        flush=True,
                    )
                    acc[n] = {"kept": 0.0, "marched": 0.0, "rays": 0.0, "k": 0}
        for n in names:
            print(f"{n}: {seconds[n] / a.steps:.3f} s/step over {a.steps} steps")
        print(f"wall {time.perf_counter() - t_start:.0f} s")
    print(f"load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
