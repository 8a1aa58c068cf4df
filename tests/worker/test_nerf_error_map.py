"""The error map (worker/nerf/error_map.py): draws follow the cells' errors, every drawn ray is
the pixel it says, the errors move toward what the rays scored, and a trainer using it keeps the
map through a checkpoint."""

from __future__ import annotations

import torch

from api_schemas.nerf import NerfConfig
from experiments.synthetic_scene import make_scene
from service.intake.nerf import validate_upload
from worker.nerf.error_map import CELLS, ErrorMap
from worker.nerf.trainer import NerfTrainer
from worker.scene.dataset import Dataset, read_meta


def _dataset(tmp_path):
    z = make_scene(tmp_path / "scene.zip", size=40, n_train=4, n_test=1)
    job = tmp_path / "job"
    job.mkdir()
    validate_upload(z, "scene.zip", {}, job, None)
    ds = job / "dataset"
    meta = read_meta(ds)
    return ds, meta, Dataset(ds, "train", meta)


def test_draws_follow_the_error_and_rays_are_their_pixels(tmp_path):
    _, _, data = _dataset(tmp_path)
    em = ErrorMap(data, share=1.0)
    g = torch.Generator().manual_seed(0)
    em.error.zero_()
    hot = 2 * CELLS * CELLS + 5 * CELLS + 7  # image 2, cell row 5, column 7
    em.error[hot] = 1.0
    o, d, rgba, idx = em.sample(500, g, jitter=0.0)
    assert torch.equal(em.cells_of(idx), torch.full((500,), hot))
    o2, d2, rgba2 = data.rays_of(idx)
    assert torch.allclose(o, o2) and torch.allclose(d, d2) and torch.equal(rgba, rgba2)
    # Half uniform: those land anywhere.
    em = ErrorMap(data, share=0.5)
    em.error.zero_()
    em.error[hot] = 1.0
    *_, idx = em.sample(1000, g)
    assert 450 <= int((em.cells_of(idx) == hot).sum()) <= 600
    # Scores move the cells they came from toward the rays' errors; other cells keep theirs.
    before = em.error.clone()
    em.update(idx[:10], torch.full((10,), 4.0))
    touched = em.cells_of(idx[:10]).unique()
    assert (em.error[touched] > before[touched]).all()
    rest = torch.ones_like(em.error, dtype=torch.bool)
    rest[touched] = False
    assert torch.equal(em.error[rest], before[rest])


def test_trainer_keeps_its_error_map_through_a_checkpoint(tmp_path):
    _, meta, data = _dataset(tmp_path)
    cfg = NerfConfig(
        steps=4,
        samples_per_step=2048,
        max_rays_per_step=256,
        log2_hashmap_size=14,
        n_levels=4,
        max_resolution=64,
        occupancy_resolution=16,
        max_samples_per_ray=48,
        error_map_share=0.5,
    ).model_dump(mode="json")
    t = NerfTrainer(cfg, meta, "cpu", data)
    for _ in range(3):
        t.train_step()
    assert not torch.equal(t.error_map.error, torch.ones_like(t.error_map.error))
    tensors, meta_out = t.state()
    resumed = NerfTrainer(cfg, meta, "cpu", data)
    resumed.load_state(tensors, meta_out)
    assert torch.equal(resumed.error_map.error, t.error_map.error)
    # Uniform draws (the default) have no map.
    assert NerfTrainer({**cfg, "error_map_share": 0.0}, meta, "cpu", data).error_map is None
