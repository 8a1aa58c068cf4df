"""Boxes past the unit cube get occupancy cascades (instant-ngp): the subject keeps the unit box's
cells, the room around it is represented by coarser ones, and checkpoints from before cascades
still load and render."""

from __future__ import annotations

import math

import pytest
import torch

from api_schemas.nerf import NerfConfig
from kernels import OccupancyGrid, march_rays
from worker.checkpoints import CheckpointManager
from worker.nerf.model import NerfField
from worker.nerf.rendering import render_rays
from worker.nerf.trainer import (
    NerfTrainer,
    cone_angle,
    grid_layout,
    max_march_step,
    occupancy_resolution,
)

CONFIG = dict(
    steps=4,
    samples_per_step=2048,
    max_rays_per_step=256,
    log2_hashmap_size=14,
    n_levels=4,
    max_resolution=64,
    occupancy_resolution=32,
    occupancy_update_every=1,
    occupancy_warmup_steps=2,
    max_samples_per_ray=256,
)
WALL = (3.0, 3.25)  # a wall across the x axis, outside the unit box


def _meta(half: float) -> dict:
    return {"aabb": [[-half] * 3, [half] * 3], "frames": []}


def _trainer(half: float) -> NerfTrainer:
    cfg = NerfConfig(**CONFIG).model_dump(mode="json")
    return NerfTrainer(cfg, _meta(half), "cpu")


def test_grid_layout_is_instant_ngps_cascades():
    assert grid_layout(1.0) == (1.0, 1)
    assert grid_layout(0.5) == (0.5, 1)
    assert grid_layout(2.0) == (1.0, 2)
    assert grid_layout(4.0) == (1.0, 3)  # log2(aabb_scale) + 1
    assert grid_layout(128.0) == (1.0, 8)
    assert grid_layout(3.0) == (0.75, 3)  # the outer cascade is the scene box exactly
    # cells per cascade: 128, halved on a CPU with cascades; a config's own value wins
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (
        occupancy_resolution(NerfConfig(), 1, cpu) == 128
        and occupancy_resolution(NerfConfig(), 3, cpu) == 64
    )
    assert occupancy_resolution(NerfConfig(), 3, cuda) == 128
    assert occupancy_resolution(NerfConfig(occupancy_resolution=128), 3, cpu) == 128
    assert max_march_step(1.0, 128, 1) == 1e10
    assert max_march_step(4.0, 128, 3) == pytest.approx(math.sqrt(3) * 8 / 128)


def test_the_trainer_puts_cascades_over_a_large_box_and_the_unit_box_keeps_its_cells():
    t = _trainer(4.0)
    assert t.grid.n_cascades == 3 and t.grid.half == [1.0] * 3
    assert t.grid.outer_aabb == [-4.0] * 3 + [4.0] * 3
    assert t.step_size == pytest.approx(2 * math.sqrt(3) / CONFIG["max_samples_per_ray"])
    # steps grow with distance in a large box: by the device's default (a CPU here)
    assert t.config.cone_angle == pytest.approx(1 / 64)
    assert cone_angle(NerfConfig(), 4.0, torch.device("cuda")) == pytest.approx(1 / 256)
    assert cone_angle(NerfConfig(), 4.0) == pytest.approx(1 / 256)  # checkpoints without one
    assert cone_angle(NerfConfig(), 1.0, torch.device("cpu")) == 0.0
    assert cone_angle(NerfConfig(cone_angle=0.002), 4.0, torch.device("cpu")) == 0.002
    # the hash grid spans the whole box; its finest level keeps max_resolution per unit box
    assert t.field.aabb_half == 4.0
    _, meta = t.state()
    assert meta["grid"]["n_cascades"] == 3 and meta["grid"]["half"] == 1.0
    assert meta["max_step"] == t.max_step
    unit = _trainer(1.0)
    assert unit.grid.n_cascades == 1 and unit.grid.half == [1.0] * 3


class WallField:
    """An analytic field (the thing tested is the grid and the marching): a grey wall."""

    backend = "ext"

    def _sigma(self, x):
        return torch.where((x[:, 0] > WALL[0]) & (x[:, 0] < WALL[1]), 200.0, 0.0)

    def encode(self, x):
        return x.contiguous()

    def density_from(self, enc):
        return self._sigma(enc)

    def density(self, x):
        return self._sigma(x)

    def __call__(self, x, dirs, enc=None):
        return self._sigma(x), torch.full((x.shape[0], 3), 0.5)


def _wall_grid(trainer: NerfTrainer) -> OccupancyGrid:
    trainer.grid.update(WallField().density, warmup=True, threshold=0.01)
    return trainer.grid


def test_a_ray_marches_into_an_outer_cascade_and_meets_the_wall_there():
    t = _trainer(4.0)
    grid = _wall_grid(t)
    o = torch.tensor([[0.0, 0.1, 0.2], [0.5, -0.3, 0.0]])
    d = torch.nn.functional.normalize(torch.tensor([[1.0, 0.05, 0.0], [1.0, 0.0, 0.1]]), dim=1)
    s = march_rays(
        o,
        d,
        grid,
        render_step_size=t.step_size,
        cone_angle=t.config.cone_angle,
        max_step=t.max_step,
        max_samples=1024,
    )
    assert (s.counts > 0).all()
    x = s.midpoints(o, d)[:, 0]
    cell = 2 * 4.0 / t.grid.resolution  # a cell of the outer cascade
    assert ((x > WALL[0] - cell) & (x < WALL[1] + cell)).all()  # empty space is skipped
    assert float((s.t_ends - s.t_starts).max()) <= t.max_step + 1e-6
    rgb, depth, opacity, stats = render_rays(
        WallField(),
        grid,
        o,
        d,
        torch.ones(3),
        step=t.step_size,
        cone_angle=t.config.cone_angle,
        max_step=t.max_step,
    )
    assert opacity.min() > 0.99 and torch.allclose(rgb, torch.full_like(rgb, 0.5), atol=0.01)
    assert ((depth * d[:, 0] + o[:, 0] - WALL[0]).abs() < 0.1).all()
    # the unit box alone (the old unposed layout) never reaches the wall: the ray sees white
    u = _trainer(1.0)
    rgb_u, _, opacity_u, _ = render_rays(
        WallField(), _wall_grid(u), o, d, torch.ones(3), step=u.step_size
    )
    assert opacity_u.max() < 0.01 and torch.allclose(rgb_u, torch.ones_like(rgb_u), atol=0.01)


def test_a_checkpoint_from_before_cascades_loads_and_renders(tmp_path):
    """State format 2 had one cascade over the whole box and neither `grid.half`, `max_step` nor
    `near_distance` in its meta: a render worker still builds that grid from it, and marches its
    rays from the camera on as it was trained."""
    from worker.jobs.nerf import NerfModel, _march

    t = _trainer(4.0)
    tensors, meta = t.state()
    old_field = NerfField(t.config, 4.0)
    old_grid = OccupancyGrid([-4.0] * 3 + [4.0] * 3, resolution=32, step_size=0.0135)
    old_grid.update(WallField().density, warmup=True)
    tensors = {k: v for k, v in tensors.items() if not k.startswith(("field.", "grid."))}
    tensors.update({f"field.{k}": v for k, v in old_field.state_dict().items()})
    tensors.update({f"grid.{k}": v for k, v in old_grid.state_dict().items()})
    # and the cone angle its trainer resolved then (instant-ngp's, whatever the device)
    meta = {**meta, "state_format": 2, "step_size": 0.0135, "cone_angle": 1 / 256}
    del meta["max_step"], meta["near_distance"]
    meta["grid"] = {"resolution": 32, "n_cascades": 1, "n_updates": 1}
    manager = CheckpointManager(tmp_path / "checkpoints")
    manager.save(3, tensors, meta)
    model = NerfModel(manager.load_latest(), torch.device("cpu"))
    assert model.grid.n_cascades == 1 and model.grid.outer_aabb == [-4.0] * 3 + [4.0] * 3
    assert torch.equal(model.grid.bits, old_grid.bits)
    o = torch.zeros(64, 3)
    d = torch.nn.functional.normalize(
        torch.randn(64, 3, generator=torch.Generator().manual_seed(0)), dim=1
    )
    bg = torch.ones(3)
    rgb, depth, alpha, _ = _march(
        model.field, model.grid, model.config, model.step_size, o, d, bg, model.max_step
    )
    with torch.no_grad():
        want = render_rays(old_field, old_grid, o, d, bg, step=0.0135, cone_angle=1 / 256)
    assert torch.allclose(rgb, want[0], atol=1e-5) and torch.isfinite(depth).all()
