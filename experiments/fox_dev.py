"""NeRF variants on a real capture, trained directly (no service) to a time budget each.

Builds the capture's dataset once through the intake (as an upload would be), then trains each
variant for `--budget` seconds of training (lr decaying over that horizon), and scores every
held-out view at full training size, plus the training views listed in `--train-views`.

    python -m experiments.fox_dev --budget 120 --variants base,dist:distortion_loss=0.01
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time
import zipfile
from pathlib import Path

import numpy as np

CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "captures"


def build(capture: str, out: Path, long_side: int, extra: dict | None = None) -> Path:
    from core.settings import Settings
    from service.intake.nerf import validate_upload

    tag = "_".join(f"{k}{v}" for k, v in (extra or {}).items()).replace(" ", "")
    job = out / f"{capture}_{long_side}{'_' + tag if tag else ''}"
    if (job / "dataset" / "cameras.json").exists():
        return job / "dataset"
    (job / "upload").mkdir(parents=True, exist_ok=True)
    src = CAPTURES / capture
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for p in sorted(src.rglob("*")):
            if p.is_file() and p.name == "transforms.json" and extra:
                zf.writestr("transforms.json", json.dumps({**json.loads(p.read_text()), **extra}))
            elif p.is_file():
                zf.write(p, p.relative_to(src).as_posix())
    z = job / "upload" / "c.zip"
    z.write_bytes(buf.getvalue())
    os.environ["TRAIN_LONG_SIDE"] = str(long_side)
    validate_upload(z, "c.zip", {}, job, Settings(data_dir=out))
    return job / "dataset"


def score(trainer, data, idx, save=None):
    from worker.nerf.rendering import render_image
    from worker.scene.evaluate import ground_truth
    from worker.scene.metrics import psnr, ssim

    trainer.field.eval()
    out = []
    for i in idx:
        f = data.frames[i]
        o, d = data.frame_rays(i)
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
            near=trainer.config.near_distance,
        )
        pred = rgb.clamp(0, 1).reshape(f.h, f.w, 3).numpy()
        gt = ground_truth(data, i, trainer.eval_background)
        out.append((psnr(pred, gt), ssim(pred, gt)))
        if save is not None:
            from PIL import Image

            both = np.concatenate([pred, gt], 1)
            Image.fromarray((both * 255).astype(np.uint8)).save(
                save / f"{Path(f.source or f.file).stem}.png"
            )
    trainer.field.train()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capture", default="fox")
    ap.add_argument("--long-side", type=int, default=400)
    ap.add_argument("--budget", type=float, default=120)
    ap.add_argument("--variants", default="base")
    ap.add_argument("--train-views", default="")
    ap.add_argument("--work", default="/tmp/fox_dev")
    ap.add_argument("--save", default="")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="train this many steps instead")
    ap.add_argument("--extra", default="", help="JSON merged into transforms.json")
    ap.add_argument(
        "--dataset",
        default="",
        help="train on this dataset folder instead (a job's, e.g. SfM's from "
        "experiments.real_captures --data-dir)",
    )
    ap.add_argument(
        "--test-views", type=int, default=0, help="score this many evenly spaced held-out views"
    )
    a = ap.parse_args(argv)

    import torch

    from api_schemas.nerf import NerfConfig
    from worker.nerf.trainer import NerfTrainer
    from worker.scene.dataset import Dataset, read_meta

    torch.set_num_threads(a.threads)
    if a.dataset:
        root = Path(a.dataset)
    else:
        root = build(a.capture, Path(a.work), a.long_side, json.loads(a.extra) if a.extra else None)
    meta = read_meta(root)
    train, test = Dataset(root, "train", meta), Dataset(root, "test", meta)
    names = [Path(f.source or f.file).stem for f in train.frames]
    tv = [names.index(n) for n in a.train_views.split(",") if n in names]
    print(
        f"box {meta['aabb'][1][0]}, {len(train.frames)} train, {len(test.frames)} test: "
        + " ".join(Path(f.source or f.file).stem for f in test.frames),
        flush=True,
    )
    for spec in a.variants.split(","):
        name, _, body = spec.partition(":")
        over = {}
        for item in filter(None, body.split("+")):
            k, _, v = item.partition("=")
            over[k] = json.loads(v)
        cfg = NerfConfig(steps=a.steps or 1_000_000, **over)
        tr = NerfTrainer(cfg, meta, "cpu", train)
        if not a.steps:
            tr.lr_horizon_s = a.budget
        t0 = time.perf_counter()
        while (tr.step < a.steps) if a.steps else (tr.train_s < a.budget):
            out = tr.train_step()
            tr.budget_used_s = tr.train_s
        wall = time.perf_counter() - t0
        save = None
        if a.save:
            save = Path(a.save) / name
            save.mkdir(parents=True, exist_ok=True)
        n_test = len(test.frames)
        idx = range(n_test)
        if 0 < a.test_views < n_test:
            idx = np.linspace(0, n_test - 1, a.test_views).round().astype(int).tolist()
        held = score(tr, test, idx, save)
        trs = score(tr, train, tv, save) if tv else []
        p = [x[0] for x in held]
        print(
            f"{name} {json.dumps(over)}: steps {tr.step} wall {wall:.0f}s train_psnr "
            f"{out['psnr']:.2f} spr {out['samples_per_ray']:.1f} rays {out['rays']} | held-out "
            f"{np.mean(p):.2f} dB ssim {np.mean([x[1] for x in held]):.3f} views "
            + " ".join(f"{v:.1f}" for v in p)
            + (" | train views " + " ".join(f"{x[0]:.1f}" for x in trs) if trs else ""),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
