"""The nerf trainer's occupancy grid starts with the cells no training camera sees marked empty,
and the marks travel with its checkpoint state."""

from __future__ import annotations

import numpy as np
import torch

from api_schemas.nerf import NerfConfig
from core.scene_build import SceneFrame, write_scene
from kernels.occupancy import UNSEEN
from tests.core.test_scene_build import ring
from worker.nerf.trainer import NerfTrainer
from worker.scene.dataset import Dataset, read_meta

CONFIG = dict(
    steps=4,
    samples_per_step=2048,
    max_rays_per_step=256,
    log2_hashmap_size=14,
    n_levels=4,
    max_resolution=64,
    occupancy_resolution=16,
    occupancy_update_every=1,
    occupancy_warmup_steps=2,
    max_samples_per_ray=64,
)


def test_trainer_keeps_cells_no_training_camera_sees_empty(tmp_path):
    # A ring of narrow views (fx 120 for 40 pixels) in a box four times the usual size: much of
    # the box is out of every view.
    rng = np.random.default_rng(0)
    frames = [
        SceneFrame(
            rng.integers(0, 255, (30, 40, 3), dtype=np.uint8),
            c2w,
            120.0,
            120.0,
            20.0,
            15.0,
            split="test" if k == 8 else "train",
        )
        for k, c2w in enumerate(ring(9))
    ]
    write_scene(tmp_path, frames, source_format="test", aabb_scale=4)
    meta = read_meta(tmp_path)
    data = Dataset(tmp_path, "train", meta)
    cfg = NerfConfig(**CONFIG).model_dump(mode="json")
    trainer = NerfTrainer(cfg, meta, "cpu", data)
    grid = trainer.grid
    unseen = grid.density < 0
    assert trainer.half == 4 and 0.2 < trainer.unseen_fraction < 0.8
    assert trainer.unseen_fraction == float(unseen.float().mean())
    # Inside the box along each camera's optical axis the cells are seen.
    eye, forward = data.c2w[:, :3, 3], -data.c2w[:, :3, 2]
    t = torch.linspace(0, 20, 2001)
    pts = (eye[:, None] + t[None, :, None] * forward[:, None]).reshape(-1, 3)
    pts = pts[(pts.abs() < trainer.half * 0.99).all(1)]
    assert len(pts) > 100 and grid.is_occupied(pts).all()
    for _ in range(cfg["steps"]):
        trainer.train_step()
    assert torch.equal(grid.density < 0, unseen) and (grid.density[unseen] == UNSEEN).all()
    # The marks are in the checkpoint state; a model loaded from it (no dataset) has them.
    tensors, state_meta = trainer.state()
    loaded = NerfTrainer(cfg, meta, "cpu")
    assert loaded.unseen_fraction == 0.0
    loaded.load_state(tensors, state_meta)
    assert torch.equal(loaded.grid.density, grid.density)
    assert loaded.unseen_fraction == trainer.unseen_fraction
