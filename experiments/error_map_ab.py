"""The error map (instant-ngp: training pixels drawn where the error is) against uniform draws,
side by side on the quality-bar scene (100x100, 60 + 10 views): two trainers identical but for
`error_map_share`, stepped alternately (so load hits both alike), scored on every held-out view
at the same steps. Prints test PSNR of each and the difference at each check, and the ratio of
their step times.

    python -m experiments.error_map_ab [--steps 400] [--every 100] [--share 0.5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--share", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=2)
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
    print(f"load average at the start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="error_map_ab_") as tmp:
        ds = _dataset(Path(tmp))
        meta = read_meta(ds)
        train, test = Dataset(ds, "train", meta), Dataset(ds, "test", meta)
        runs = {}
        for name, share in (("uniform", 0.0), (f"error map {a.share}", a.share)):
            cfg = {**CPU_CONFIG, "steps": a.steps, "error_map_share": share}
            runs[name] = NerfTrainer(NerfConfig(**cfg).model_dump(mode="json"), meta, "cpu", train)
        names = list(runs)
        print(f"| step | {' | '.join(f'{n} test PSNR' for n in names)} | difference |")
        print("|---|---|---|---|")
        seconds = dict.fromkeys(names, 0.0)
        for step in range(1, a.steps + 1):
            for n in names:
                seconds[n] += runs[n].train_step()["seconds"]
            if step % a.every == 0 or step == a.steps:
                scores = []
                for n in names:
                    m, _ = evaluate(
                        lambda i, t=runs[n]: JOB.render_test_view(t, test, i),
                        test,
                        runs[n].eval_background,
                    )
                    scores.append(m["test_psnr"])
                cells = " | ".join(f"{s:.2f}" for s in scores)
                print(f"| {step} | {cells} | {scores[1] - scores[0]:+.2f} dB |", flush=True)
        ratio = seconds[names[1]] / seconds[names[0]]
        print(
            f"step time {names[1]} / {names[0]}: {ratio:.3f} "
            f"({seconds[names[1]]:.1f} s / {seconds[names[0]]:.1f} s over {a.steps} steps)"
        )
    print(f"load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
