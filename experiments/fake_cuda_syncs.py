"""Host synchronisations per training step on the GPU code path, counted on the fake CUDA device.

Trains a small nerf job and a small splat job (the synthetic scene, 32 px) a few dozen steps each
on tests/support/fake_cuda.py's device and counts every kind of host synchronisation a step
makes: explicit reads (`.item()`, `float()`, `.tolist()`, device-to-host copies) and implicit
ones (ops whose output size depends on device data: `nonzero`, boolean-mask indexing, `unique`,
`march_rays`' sample count). Prints, per job, the per-call-site breakdown, then as its last line
JSON `{"nerf": n, "splat": n}`: synchronisations per step, both kinds together.

    python -m experiments.fake_cuda_syncs [--steps 40] [--warmup 10]

The first `--warmup` steps are not counted (the occupancy grid's warm-up phase and the first
densification differ from the steady state); the counted window still holds occupancy updates
(every 4 steps) and a densification (every 10), so their syncs are spread over the steps.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import zipfile
from pathlib import Path

import torch

NERF = dict(
    samples_per_step=4096,
    max_rays_per_step=256,
    log2_hashmap_size=14,
    n_levels=4,
    max_resolution=64,
    occupancy_resolution=16,
    occupancy_update_every=4,
    occupancy_warmup_steps=8,
    max_samples_per_ray=64,
    aabb_scale=4,
)
SPLAT = dict(
    sh_degree=1,
    densify_from=5,
    densify_every=10,
    opacity_reset_every=1000,
    init="random",
    n_init_points=500,
)


def _job(tmp: Path, kind: str, config: dict, files: dict[str, bytes]):
    """The upload through the API's intake: (config, meta, training Dataset)."""
    from core.settings import Settings
    from service.intake.nerf import validate_upload as nerf
    from service.intake.splat import validate_upload as splat
    from worker.scene.dataset import Dataset, read_meta

    job = tmp / kind
    (job / "upload").mkdir(parents=True)
    src = job / "upload" / "scene.zip"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    src.write_bytes(buf.getvalue())
    validate = nerf if kind == "nerf" else splat
    cfg, _ = validate(src, "scene.zip", config, job, Settings(data_dir=tmp))
    meta = read_meta(job / "dataset")
    return cfg, meta, Dataset(job / "dataset", "train", meta), job / "dataset"


def _count(trainer, steps: int, warmup: int):
    from tests.support.fake_cuda import counts

    for _ in range(warmup):
        trainer.train_step()
    before = counts.snapshot()
    for _ in range(steps):
        trainer.train_step()
    return counts.since(before)


def _report(kind: str, spent, steps: int) -> float:
    per_step = (spent.syncs + spent.implicit) / steps
    print(f"{kind}: {spent.summary(steps)} per step; {per_step:g} synchronisations in all")
    for (what, name, site), n in spent.where.most_common():
        if what != "h2d":
            print(f"    {n / steps:6.2f}/step  {what:8} {name:24} {site}")
    for (what, name, site), n in spent.where.most_common():
        if what == "h2d":
            print(f"    {n / steps:6.2f}/step  {what:8} {name:24} {site}")
    return per_step


def measure(steps: int = 40, warmup: int = 10) -> dict[str, float]:
    """Synchronisations per step (explicit + implicit) of each job kind on the fake device."""
    from experiments.synthetic_scene import scene_files
    from tests.support.fake_cuda import fake_cuda
    from worker.nerf.trainer import NerfTrainer
    from worker.splat.trainer import SplatTrainer

    cuda = torch.device("cuda")
    files = scene_files(size=32, n_train=12, n_test=2, seed=3)
    total = steps + warmup
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg, meta, data, _ = _job(Path(tmp), "nerf", {**NERF, "steps": total}, files)
        with fake_cuda():
            spent = _count(NerfTrainer(cfg, meta, cuda, data), steps, warmup)
        out["nerf"] = _report("nerf", spent, steps)
        cfg, meta, data, ds = _job(Path(tmp), "splat", {**SPLAT, "steps": total}, files)
        with fake_cuda():
            spent = _count(SplatTrainer(cfg, meta, cuda, data, ds), steps, warmup)
        out["splat"] = _report("splat", spent, steps)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="counted steps per job")
    ap.add_argument("--warmup", type=int, default=10, help="steps before counting")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = measure(a.steps, a.warmup)
    print(json.dumps({k: round(v, 2) for k, v in out.items()}))


if __name__ == "__main__":
    main()
