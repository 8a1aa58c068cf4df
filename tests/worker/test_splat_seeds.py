"""Seeds for a posed upload without sparse points: SIFT matches triangulated with the known
cameras (worker/sfm/triangulate.py) land on the true surface, the splat job writes them where
the trainer starts from them, and a run past its cap falls back (random start)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from api_schemas.splat import SplatConfig
from core.settings import Settings
from experiments.sfm_capture import make_capture
from experiments.synthetic_scene import textured_scene, trace
from service.intake.splat import validate_upload
from worker.jobs.splat import triangulate_seeds, wants_triangulation
from worker.scene.dataset import Dataset, read_meta
from worker.sfm.triangulate import to_world, triangulate
from worker.splat.trainer import TRIANGULATED_POINTS, SplatTrainer, read_points3d


@pytest.fixture(scope="module")
def posed(tmp_path_factory):
    capture = make_capture(16, 160, n_test=0)
    tmp = tmp_path_factory.mktemp("posed")
    job = tmp / "job"
    (job / "upload").mkdir(parents=True)
    src = job / "upload" / "scene.zip"
    src.write_bytes(capture.posed_zip())
    cfg, _ = validate_upload(src, "scene.zip", {}, job, Settings(data_dir=tmp))
    return capture, cfg, job


def surface_error(capture, world: np.ndarray) -> np.ndarray:
    """Per point: how far from the surface along the ray of the camera that sees it best."""
    scene, best = textured_scene(0), np.full(len(world), np.inf)
    for c2w in capture.c2w:
        o = np.repeat(c2w[None, :3, 3], len(world), 0)
        d = world - o
        dist = np.linalg.norm(d, axis=1)
        _, _, depth = trace(scene, o, d / dist[:, None])
        best = np.minimum(best, np.abs(depth - dist))
    return best


def test_triangulated_seeds_lie_on_the_surface(posed, tmp_path):
    capture, _, job = posed
    meta = read_meta(job / "dataset")
    r = triangulate(job / "dataset", meta, tmp_path, max_seconds=60, threads=2)
    world = to_world(r.xyz, meta["normalization"])
    err = surface_error(capture, world)
    n_train = sum(f.get("split", "train") == "train" for f in meta["frames"])
    assert len(world) >= 50 and r.n_images == n_train >= 12
    assert np.median(err) < 0.01 and (err < 0.05).mean() > 0.8, np.percentile(err, [50, 90])
    # random points in the scene box (the old start) are nowhere near it
    lo, hi = (np.array(v) for v in meta["aabb"])
    rand = to_world(
        np.random.default_rng(0).uniform(lo * 0.5, hi * 0.5, (200, 3)), meta["normalization"]
    )
    assert np.median(surface_error(capture, rand)) > 10 * np.median(err)


def test_the_job_seeds_the_trainer_and_falls_back_past_its_cap(posed, caplog):
    _, stored, job = posed
    cfg = SplatConfig.model_validate(stored)
    dataset, meta = job / "dataset", read_meta(job / "dataset")
    ctx = SimpleNamespace(
        config=cfg.model_copy(update={"seed_max_s": 0.01}),
        settings=Settings(data_dir=job.parent, sfm_threads=2),
        paths=SimpleNamespace(dataset=dataset, root=job),
        job=SimpleNamespace(id="j"),
    )
    assert cfg.seed_points == "auto" and wants_triangulation(cfg, dataset)
    assert not wants_triangulation(cfg.model_copy(update={"init": "random"}), dataset)
    triangulate_seeds(ctx, meta)  # cancelled within its 0.01 s
    assert not (dataset / TRIANGULATED_POINTS).exists()
    assert "cap" in caplog.text and "random start" in caplog.text

    ctx.config = cfg
    triangulate_seeds(ctx, meta)
    assert (dataset / TRIANGULATED_POINTS).is_file() and not (job / "seeds").exists()
    assert not wants_triangulation(cfg, dataset)  # a resumed job does not triangulate again
    pts, _ = read_points3d(dataset / TRIANGULATED_POINTS, meta["normalization"])
    trainer = SplatTrainer(cfg, meta, torch.device("cpu"), Dataset(dataset, "train", meta), dataset)
    assert trainer.n == len(pts) >= 50
    torch.testing.assert_close(trainer.params["means"].detach(), pts)
