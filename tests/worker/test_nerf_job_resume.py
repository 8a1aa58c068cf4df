"""The nerf trainer's checkpoint state round-trips: a run stopped at step k and resumed from its
checkpoint (through the real CheckpointManager files) ends where an uninterrupted run ends."""

from __future__ import annotations

import torch

from api_schemas.nerf import NerfConfig
from experiments.synthetic_scene import make_scene
from service.intake.nerf import validate_upload
from worker.checkpoints import CheckpointManager
from worker.nerf.trainer import NerfTrainer
from worker.scene.dataset import Dataset, read_meta

CONFIG = dict(
    steps=12,
    samples_per_step=2048,
    max_rays_per_step=512,
    log2_hashmap_size=14,
    n_levels=8,
    max_resolution=256,
    occupancy_resolution=16,
    occupancy_update_every=2,
    occupancy_warmup_steps=4,
    max_samples_per_ray=96,
)


def _dataset(tmp_path):
    z = make_scene(tmp_path / "scene.zip", size=16, n_train=6, n_test=2)
    job = tmp_path / "job"
    job.mkdir()
    validate_upload(z, "scene.zip", {}, job, None)
    return job / "dataset"


def _trainer(ds, cfg):
    meta = read_meta(ds)
    return NerfTrainer(cfg, meta, "cpu", Dataset(ds, "train", meta))


def test_resume_from_checkpoint_continues_the_same_run(tmp_path):
    torch.set_num_threads(1)  # one thread: the kernels' gradient sums are then bit-reproducible
    ds = _dataset(tmp_path)
    cfg = NerfConfig(**CONFIG).model_dump(mode="json")
    straight = _trainer(ds, cfg)
    for _ in range(cfg["steps"]):
        straight.train_step()

    first = _trainer(ds, cfg)
    for _ in range(7):
        first.train_step()
    mgr = CheckpointManager(tmp_path / "ckpt")
    mgr.save(first.step, *first.state())
    ckpt = CheckpointManager(tmp_path / "ckpt").load_latest()
    assert ckpt.step == 7 and ckpt.meta["config"] == cfg

    resumed = _trainer(ds, cfg)
    resumed.load_state(ckpt.tensors, ckpt.meta)
    assert resumed.step == 7 and resumed.n_rays == first.n_rays
    assert torch.equal(resumed.grid.bits, first.grid.bits)
    while resumed.step < cfg["steps"]:
        resumed.train_step()

    a, b = straight.field.state_dict(), resumed.field.state_dict()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6, rtol=1e-5), k
    assert torch.equal(straight.grid.bits, resumed.grid.bits)
    # A fresh trainer that did not resume differs: the comparison above can fail.
    fresh = _trainer(ds, cfg)
    for _ in range(cfg["steps"] - 7):
        fresh.train_step()
    assert not torch.allclose(fresh.field.encoding.params, resumed.field.encoding.params)
