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
    cfg = NerfConfig(**CONFIG, occupancy_min_views=1).model_dump(mode="json")  # seen by one view
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


def _frames(sizes: dict[str, list[tuple[int, int]]]) -> dict:
    return {
        "frames": [{"w": w, "h": h, "split": split} for split, whs in sizes.items() for w, h in whs]
    }


def test_the_default_table_grows_with_the_training_pixels_up_to_instant_ngps():
    from worker.nerf.trainer import table_log2

    quality_bar = _frames({"train": [(100, 100)] * 60, "test": [(100, 100)] * 10})
    assert table_log2(NerfConfig(log2_hashmap_size=None), quality_bar) == 17  # 6e5 pixels
    # held-out views train nothing: they do not count
    more_tests = _frames({"train": [(100, 100)] * 60, "test": [(100, 100)] * 500})
    assert table_log2(NerfConfig(), more_tests) == 17
    assert table_log2(NerfConfig(), _frames({"train": [(100, 100)] * 240})) == 19  # 2.4e6 = 2^21.2
    # a Blender scene at full size, and five phone photos at the 800-px training size
    assert table_log2(NerfConfig(), _frames({"train": [(800, 800)] * 100})) == 19
    assert table_log2(NerfConfig(), _frames({"train": [(800, 600)] * 5})) == 19
    assert table_log2(NerfConfig(), _frames({"train": [(40, 30)] * 8})) == 14
    # a size the job asked for is kept, larger or smaller than the default
    assert table_log2(NerfConfig(log2_hashmap_size=22), quality_bar) == 22
    assert (
        table_log2(NerfConfig(log2_hashmap_size=14), _frames({"train": [(800, 800)] * 100})) == 14
    )


def test_a_default_table_size_travels_with_the_checkpoint_to_the_renderer(tmp_path):
    """The resolved size is in the checkpoint's meta, so a render worker builds the same table
    without the dataset (the job's config still says None)."""
    from worker.checkpoints import CheckpointManager
    from worker.jobs.nerf import NerfModel

    rng = np.random.default_rng(0)
    frames = [
        SceneFrame(rng.integers(0, 255, (64, 96, 3), dtype=np.uint8), c2w, 90.0, 90.0, 48.0, 32.0)
        for c2w in ring(40)
    ]
    scene = tmp_path / "dataset"
    write_scene(scene, frames, source_format="test")
    meta = read_meta(scene)
    cfg = NerfConfig(**{**CONFIG, "log2_hashmap_size": None, "n_levels": 8}).model_dump(mode="json")
    trainer = NerfTrainer(cfg, meta, "cpu", Dataset(scene, "train", meta))
    # 40 x 96 x 64 = 245760 pixels: floor(log2) 17, two below
    assert trainer.field.encoding.log2_hashmap_size == 15
    for _ in range(2):
        trainer.train_step()
    tensors, state_meta = trainer.state()
    assert state_meta["config"]["log2_hashmap_size"] is None
    assert state_meta["log2_hashmap_size"] == 15
    manager = CheckpointManager(tmp_path / "checkpoints")
    manager.save(trainer.step, tensors, state_meta)
    model = NerfModel(manager.load_latest(), torch.device("cpu"))
    assert model.field.encoding.params.shape == trainer.field.encoding.params.shape
    assert torch.equal(model.field.encoding.params, trainer.field.encoding.params)


def _ring_trainer(tmp_path, **over):
    rng = np.random.default_rng(1)
    frames = [
        SceneFrame(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8), c2w, 60.0, 60.0, 20.0, 15.0)
        for c2w in ring(6)
    ]
    write_scene(tmp_path, frames, source_format="test", aabb_scale=1)
    meta = read_meta(tmp_path)
    cfg = NerfConfig(**{**CONFIG, "occupancy_warmup_steps": 0, **over})
    return NerfTrainer(cfg, meta, "cpu", Dataset(tmp_path, "train", meta))


def test_alpha_threshold_and_distortion_loss_act_in_a_training_step(tmp_path):
    # A fresh field is a thin fog (sigma ~ 0.37): each sample's alpha over a step of ~0.05 is
    # ~2 %, so a 5 % threshold skips every sample, and none reaches the networks.
    plain = _ring_trainer(tmp_path / "a")
    out = plain.train_step()
    assert out["samples_per_ray"] > 1
    culled = _ring_trainer(tmp_path / "b", alpha_threshold=0.05)
    assert culled.train_step()["samples_per_ray"] == 0
    # The distortion loss adds to the loss the step optimises (the photometric part reported
    # stays the same for the same first batch) and gives the density network a gradient.
    dist = _ring_trainer(tmp_path / "c", distortion_loss=0.5)
    seen = {}
    head = dist.field.density_net[-1].bias
    head.register_hook(lambda g: seen.setdefault("g", g.clone()))
    out_d = dist.train_step()
    assert out_d["loss"] == out["loss"] and out_d["samples_per_ray"] == out["samples_per_ray"]
    base = _ring_trainer(tmp_path / "d")
    seen_base = {}
    base.field.density_net[-1].bias.register_hook(lambda g: seen_base.setdefault("g", g.clone()))
    base.train_step()
    assert not torch.allclose(seen["g"][0], seen_base["g"][0])
