"""kind=splat: posed photos -> 3D Gaussians -> frames for any camera, and a PLY export.

The job skeleton (checkpoints, resume, evaluation artifacts, renders, camera paths) is
worker.jobs.scene's; this module adds the Gaussian trainer, rasterising one view, and the
3DGS PLY of the trained Gaussians in the dataset's world units.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from api_schemas.splat import SplatConfig
from worker.jobs.scene import SceneJob, SceneModel
from worker.scene.cameras import RenderCamera, world_distance
from worker.scene.dataset import Dataset
from worker.scene.evaluate import evaluate as evaluate_views
from worker.scene.pinhole import to_pinhole
from worker.splat import model as gm
from worker.splat.ply import ply_bytes
from worker.splat.trainer import TRIANGULATED_POINTS, SplatTrainer, to_numpy

PLY_NAME = "point_cloud.ply"
SEEDS_WORK_DIR = "seeds"
log = logging.getLogger(__name__)


def wants_triangulation(config: SplatConfig, dataset_dir: Path) -> bool:
    """Whether the job triangulates seeds from its photos before training (`seed_points`)."""
    mode = config.seed_points
    if mode == "random" or config.init == "random":
        return False
    if (dataset_dir / TRIANGULATED_POINTS).is_file():
        return False  # done by an earlier run of this job
    return mode == "triangulate" or not (dataset_dir / "points3D.txt").is_file()


def seed_cap_s(config: SplatConfig, settings) -> float:
    """Seconds triangulating seeds may take: seed_max_s, a quarter of the time limit, SfM's cap."""
    cap = float(config.seed_max_s)
    if config.time_limit_s:
        cap = min(cap, float(config.time_limit_s) / 4)
    if settings.sfm_max_seconds:
        cap = min(cap, float(settings.sfm_max_seconds))
    return cap


def triangulate_seeds(ctx, meta: dict[str, Any]) -> None:
    """Writes dataset/points3D_triangulated.txt when it can; logs why not otherwise (the
    trainer then starts from random points or the upload's own)."""
    from worker.sfm.triangulate import TriangulationFailed, to_world, triangulate, write_points3d

    dataset, work = ctx.paths.dataset, ctx.paths.root / SEEDS_WORK_DIR
    s = ctx.settings
    try:
        r = triangulate(
            dataset,
            meta,
            work,
            seed_cap_s(ctx.config, s),
            threads=s.sfm_threads,
            max_image_size=s.sfm_max_image_size,
            exhaustive_max_images=s.sfm_exhaustive_max_images,
        )
    except TriangulationFailed as e:
        log.warning("job %s: no triangulated seeds (%s); random start", ctx.job.id, e)
        return
    except Exception:  # COLMAP refusing an image must not fail the training job
        log.exception("job %s: triangulating seeds failed; random start", ctx.job.id)
        return
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_points3d(dataset / TRIANGULATED_POINTS, to_world(r.xyz, meta["normalization"]), r.rgb)
    log.info(
        "job %s: %d seed points triangulated from %d photos in %.1f s",
        ctx.job.id,
        len(r.xyz),
        r.n_images,
        sum(r.seconds.values()),
    )


class SplatModel(SceneModel):
    def __init__(self, checkpoint, device):
        super().__init__(checkpoint, device)
        self.params = {k: checkpoint.tensors[k].to(device) for k in gm.NAMES}
        self.degree = int(checkpoint.meta["sh_degree"])
        self.antialiased = bool(checkpoint.meta.get("antialiased", False))


class SplatJob(SceneJob):
    kind = "splat"
    model_class = SplatModel

    def dataset(self, ctx, split, meta):
        # The rasteriser projects pinhole cameras: photos through a distorting lens (posed
        # uploads; SfM captures come undistorted already) are resampled to pinhole ones.
        return to_pinhole(super().dataset(ctx, split, meta))

    def make_trainer(self, ctx, meta, data):
        if wants_triangulation(ctx.config, ctx.paths.dataset):
            triangulate_seeds(ctx, meta)
        return SplatTrainer(ctx.config, meta, ctx.device, data, ctx.paths.dataset)

    def render_test_view(self, trainer, data, i):
        f = data.frames[i]
        cam = RenderCamera(
            torch.tensor(f.c2w, dtype=torch.float32), f.fx, f.fy, f.cx, f.cy, f.w, f.h
        )
        with torch.no_grad():
            out = gm.render(
                trainer.params,
                cam,
                trainer.eval_background,
                trainer.degree,
                "tiled",
                trainer.antialiased,
            )
            depth = gm.render_depth(trainer.params, cam, out)
        return to_numpy(out.rgb), world_distance(depth, data.normalization).cpu().numpy()

    def final_metrics(self, ctx, trainer, test, metrics):
        metrics["n_gaussians"] = trainer.n
        # what the schedule did within the job's horizon (steps or time budget)
        metrics.update(trainer.counts)
        metrics["schedule_step"] = round(trainer.sched, 1)
        # world units, so that viewers show the scene as uploaded
        (ctx.paths.artifacts / PLY_NAME).write_bytes(
            ply_bytes(trainer.params, test.normalization, trainer.antialiased)
        )
        return [PLY_NAME]

    def render_view(self, model: SplatModel, cam: RenderCamera, background, output):
        with torch.no_grad():
            out = gm.render(model.params, cam, background, model.degree, "tiled", model.antialiased)
            depth = (
                gm.render_depth(model.params, cam, out)
                if output == "depth"
                else torch.zeros(cam.height, cam.width)
            )
        return to_numpy(out.rgb), depth.cpu().numpy(), out.alpha.cpu().numpy()


JOB = SplatJob()


def evaluate(trainer: SplatTrainer, test: Dataset, keep: int = 0):
    """Test-split scores of a trainer (experiments/splat_quality.py), as the job measures them."""
    return evaluate_views(
        lambda i: JOB.render_test_view(trainer, test, i), test, trainer.eval_background, keep
    )
