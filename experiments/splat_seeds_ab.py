"""Random vs triangulated seeds for a posed upload without sparse points (issue 29 part 6).

The capture-like scene's `posed` upload (experiments/capture_scene.py: instant-ngp transforms.json
with lens distortion, no points) goes through the real intake; the splat trainer then runs the same
number of steps from `seed_points: random` and from `auto` (SIFT matches triangulated with the
known cameras, worker/sfm/triangulate.py), in process, and prints held-out PSNR for each.

    python -m experiments.splat_seeds_ab --steps 300 --views 50
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from api_schemas.splat import SplatConfig
from core.settings import Settings
from experiments.capture_scene import capture_files, zip_bytes
from service.intake.splat import validate_upload
from worker.jobs.splat import triangulate_seeds, wants_triangulation
from worker.scene.cameras import RenderCamera
from worker.scene.dataset import Dataset, composite_background, read_meta
from worker.scene.pinhole import to_pinhole
from worker.splat import model as gm
from worker.splat.trainer import SplatTrainer


def held_out_psnr(trainer: SplatTrainer, test: Dataset) -> float:
    out = []
    for i, f in enumerate(test.frames):
        cam = RenderCamera(
            torch.tensor(f.c2w, dtype=torch.float32), f.fx, f.fy, f.cx, f.cy, f.w, f.h
        )
        with torch.no_grad():
            rgb = gm.render(
                trainer.params, cam, trainer.eval_background, trainer.degree, "tiled"
            ).rgb
        gt = composite_background(test.frame_rgba(i), trainer.eval_background)[..., :3]
        keep = test.frame_mask(i)
        err = ((rgb - gt) ** 2).mean(-1)
        mse = err[keep > 0].mean() if keep is not None else err.mean()
        out.append(float(-10 * torch.log10(mse)))
    return float(np.mean(out))


def run(job: Path, stored: dict, steps: int) -> dict:
    cfg = SplatConfig.model_validate(stored)
    ds = job / "dataset"
    meta = read_meta(ds)
    settings = Settings(data_dir=job.parent, sfm_threads=2)
    ctx = SimpleNamespace(
        config=cfg,
        settings=settings,
        paths=SimpleNamespace(dataset=ds, root=job),
        job=SimpleNamespace(id=job.name),
    )
    t0 = time.perf_counter()
    if wants_triangulation(cfg, ds):
        triangulate_seeds(ctx, meta)
    seed_s = time.perf_counter() - t0
    data = to_pinhole(Dataset(ds, "train", meta))
    test = to_pinhole(Dataset(ds, "test", meta))
    tr = SplatTrainer(cfg, meta, torch.device("cpu"), data, ds)
    n0 = tr.n
    t0 = time.perf_counter()
    for _ in range(steps):
        tr.train_step()
    return {
        "seeds": n0,
        "seed_s": round(seed_s, 1),
        "train_s": round(time.perf_counter() - t0, 1),
        "gaussians": tr.n,
        "psnr": round(held_out_psnr(tr, test), 2),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--views", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    files = capture_files(a.views)["posed"]
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("random", "auto"):
            job = Path(tmp) / mode
            (job / "upload").mkdir(parents=True)
            src = job / "upload" / "scene.zip"
            src.write_bytes(zip_bytes(files))
            cfg, _ = validate_upload(
                src,
                "scene.zip",
                {"seed_points": mode, "steps": a.steps},
                job,
                Settings(data_dir=Path(tmp)),
            )
            print(mode, run(job, cfg, a.steps), flush=True)


if __name__ == "__main__":
    main()
