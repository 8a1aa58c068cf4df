"""Splat quality bar: train kind=splat on the synthetic exact-ground-truth scene and print test
PSNR / SSIM over wall-clock time (goal of issue 8: >= 25 dB within 15 minutes on the CPU).

    python -m experiments.splat_quality [--minutes 15 --size 100 --steps 30000 --eval-every 60]

Runs the worker's own intake (service.intake.splat) and trainer (worker.splat.trainer) in-process,
so the table measures exactly what a job does, minus the HTTP and Celery hops.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--train", type=int, default=60)
    ap.add_argument("--test", type=int, default=10)
    ap.add_argument(
        "--steps",
        type=int,
        default=30_000,
        help="schedule length (training also stops at --minutes)",
    )
    ap.add_argument(
        "--eval-every", type=float, default=60.0, help="seconds of training between evaluations"
    )
    ap.add_argument("--config", default="{}", help="JSON overrides of SplatConfig")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)

    from core.settings import get_settings
    from experiments.synthetic_scene import make_scene
    from service.intake.splat import validate_upload
    from worker.jobs.splat import evaluate
    from worker.scene.dataset import Dataset, read_meta
    from worker.splat.trainer import SplatTrainer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        make_scene(tmp / "scene.zip", a.size, a.train, a.test)
        job = tmp / "job"
        (job / "upload").mkdir(parents=True)
        config = {"steps": a.steps, **json.loads(a.config)}
        config, _ = validate_upload(tmp / "scene.zip", "scene.zip", config, job, get_settings())
        print(
            f"scene: {a.train} train + {a.test} test views at {a.size}px ({time.perf_counter() - t0:.0f} s)"
        )
        meta = read_meta(job / "dataset")
        trainer = SplatTrainer(
            config,
            meta,
            torch.device("cpu"),
            Dataset(job / "dataset", "train", meta),
            job / "dataset",
        )
        test = Dataset(job / "dataset", "test", meta)
        print(
            f"config: {json.dumps({k: config[k] for k in ('steps', 'n_init_points', 'sh_degree', 'method')})}"
        )
        print("| train s | step | Gaussians | test PSNR dB | test SSIM |")
        print("|---:|---:|---:|---:|---:|")
        budget, next_eval, best = a.minutes * 60, a.eval_every, 0.0
        while trainer.step < config["steps"] and trainer.train_s < budget:
            trainer.train_step()
            if (
                trainer.train_s >= next_eval
                or trainer.train_s >= budget
                or trainer.step == config["steps"]
            ):
                m, _ = evaluate(trainer, test)
                best = max(best, m["test_psnr"])
                print(
                    f"| {trainer.train_s:.0f} | {trainer.step} | {trainer.n} | {m['test_psnr']:.2f} | "
                    f"{m['test_ssim']:.3f} |",
                    flush=True,
                )
                next_eval += a.eval_every
        print(
            f"best test PSNR {best:.2f} dB after {trainer.train_s:.0f} s of training "
            f"({'meets' if best >= 25 else 'misses'} the 25 dB bar)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
