"""Test PSNR over a whole training run on the quality-bar scene, in one process (no HTTP stack):
the curve that shows whether held-out quality peaks and then decays.

The learning rate follows a job's schedule over `--budget-s` training seconds (the quality bar's
780 s) or over `--steps`, and every `--every` steps all held-out views are rendered and scored.
The test error is also split by where it lies: the silhouette band (pixels within one pixel of
the ground truth's alpha edge) and the rest, since a field that fits its training rays exactly
shows its errors on new views' silhouettes first. Config overrides (`--set key=value`, JSON
values) let two runs differ in one setting.

    python -m experiments.nerf_curve [--budget-s 780] [--every 100] [--set mlp_precision="float32"]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def silhouette_band(alpha):
    """(H, W) bool: pixels whose 3x3 neighbourhood holds both empty (alpha 0) and covered ones."""
    from scipy.ndimage import binary_dilation

    covered = alpha > 0
    ring = np.ones((3, 3), bool)
    return binary_dilation(covered, ring) & binary_dilation(~covered, ring)


def region_psnr(views, band_masks) -> dict[str, float]:
    """PSNR over the silhouette bands and over the other pixels, and the bands' share of the
    squared error, from (render, ground truth) pairs."""
    err = np.stack([((p - g) ** 2).mean(-1) for p, g in views])
    band = np.stack(band_masks)

    def db(m):
        return float(-10 * np.log10(max(err[m].mean(), 1e-12)))

    return {
        "band_psnr": db(band),
        "rest_psnr": db(~band),
        "band_share": float(err[band].sum() / err.sum()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=780.0)
    ap.add_argument(
        "--steps",
        type=int,
        help="train this many steps with the schedule over them instead of a time budget: the "
        "curve then does not depend on the machine's load, so runs can share the CPU",
    )
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args(argv)

    import torch

    from api_schemas.nerf import NerfConfig
    from experiments.nerf_quality import CPU_CONFIG
    from experiments.nerf_step_bench import _dataset
    from worker.jobs.nerf import JOB
    from worker.nerf.trainer import NerfTrainer
    from worker.scene.dataset import Dataset, read_meta
    from worker.scene.evaluate import evaluate, ground_truth

    torch.set_num_threads(a.threads)
    overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in a.set)}
    steps = a.steps or 1_000_000
    config = NerfConfig(**{**CPU_CONFIG, "steps": steps, **overrides}).model_dump(mode="json")
    rows = []
    with tempfile.TemporaryDirectory(prefix="nerf_curve_") as tmp:
        ds = _dataset(Path(tmp))
        meta = read_meta(ds)
        trainer = NerfTrainer(config, meta, "cpu", Dataset(ds, "train", meta))
        if not a.steps:
            trainer.lr_horizon_s = a.budget_s
        test = Dataset(ds, "test", meta)
        bands = [silhouette_band(test.frame_rgba(i)[..., 3].numpy()) for i in range(len(test))]
        horizon = f"{a.steps} steps" if a.steps else f"budget {a.budget_s:.0f} s"
        print(f"overrides {overrides or '-'}; {horizon}", flush=True)
        print(
            "| step | train s | lr | train PSNR (batch) | test PSNR | test SSIM "
            "| silhouette band PSNR | rest PSNR | band's share of the error |"
        )
        print("|---|---|---|---|---|---|---|---|---|")

        def done() -> bool:
            return trainer.step >= a.steps if a.steps else trainer.train_s >= a.budget_s

        while not done():
            r = trainer.train_step()
            trainer.budget_used_s = trainer.train_s
            if trainer.step % a.every == 0 or done():
                t = time.perf_counter()
                views = []
                m, _ = evaluate(
                    lambda i: JOB.render_test_view(trainer, test, i),
                    test,
                    trainer.eval_background,
                    on_view=lambda v: views.append(
                        (v.rgb, ground_truth(test, v.index, trainer.eval_background))
                    ),
                )
                row = {
                    "step": trainer.step,
                    "train_s": round(trainer.train_s, 1),
                    "lr": trainer.lr_at(trainer.step),
                    "train_psnr": r["psnr"],
                    "test_psnr": m["test_psnr"],
                    "test_ssim": m["test_ssim"],
                    **region_psnr(views, bands),
                    "eval_s": round(time.perf_counter() - t, 1),
                }
                rows.append(row)
                print(
                    f"| {row['step']} | {row['train_s']} | {row['lr']:.2e} | "
                    f"{row['train_psnr']:.2f} | {row['test_psnr']:.2f} | {row['test_ssim']:.3f} | "
                    f"{row['band_psnr']:.2f} | {row['rest_psnr']:.2f} | {row['band_share']:.2f} |",
                    flush=True,
                )
    best = max(rows, key=lambda r: r["test_psnr"])
    print(
        f"best {best['test_psnr']:.2f} dB at step {best['step']}; last {rows[-1]['test_psnr']:.2f}"
        f" dB ({rows[-1]['test_psnr'] - best['test_psnr']:+.2f})"
    )
    if a.json_out:
        a.json_out.write_text(json.dumps({"overrides": overrides, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
