"""Test PSNR over a whole training run on the quality-bar scene, in one process (no HTTP stack):
the curve that shows whether held-out quality peaks and then decays.

The learning rate follows a job's schedule over `--budget-s` training seconds (the quality bar's
780 s), and every `--every` steps all held-out views are rendered and scored. Config overrides
(`--set key=value`, JSON values) let two runs differ in one setting.

    python -m experiments.nerf_curve [--budget-s 780] [--every 100] [--set mlp_precision="float32"]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=780.0)
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
    from worker.scene.evaluate import evaluate

    torch.set_num_threads(a.threads)
    overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in a.set)}
    config = NerfConfig(**{**CPU_CONFIG, "steps": 1_000_000, **overrides}).model_dump(mode="json")
    rows = []
    with tempfile.TemporaryDirectory(prefix="nerf_curve_") as tmp:
        ds = _dataset(Path(tmp))
        meta = read_meta(ds)
        trainer = NerfTrainer(config, meta, "cpu", Dataset(ds, "train", meta))
        trainer.lr_horizon_s = a.budget_s
        test = Dataset(ds, "test", meta)
        print(f"overrides {overrides or '-'}; budget {a.budget_s:.0f} s", flush=True)
        print("| step | train s | lr | train PSNR (batch) | test PSNR | test SSIM |")
        print("|---|---|---|---|---|---|")
        while trainer.train_s < a.budget_s:
            r = trainer.train_step()
            trainer.budget_used_s = trainer.train_s
            if trainer.step % a.every == 0 or trainer.train_s >= a.budget_s:
                t = time.perf_counter()
                m, _ = evaluate(
                    lambda i: JOB.render_test_view(trainer, test, i), test, trainer.eval_background
                )
                row = {
                    "step": trainer.step,
                    "train_s": round(trainer.train_s, 1),
                    "lr": trainer.lr_at(trainer.step),
                    "train_psnr": r["psnr"],
                    "test_psnr": m["test_psnr"],
                    "test_ssim": m["test_ssim"],
                    "eval_s": round(time.perf_counter() - t, 1),
                }
                rows.append(row)
                print(
                    f"| {row['step']} | {row['train_s']} | {row['lr']:.2e} | "
                    f"{row['train_psnr']:.2f} | {row['test_psnr']:.2f} | {row['test_ssim']:.3f} |",
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
