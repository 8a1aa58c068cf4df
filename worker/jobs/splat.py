"""kind=splat: posed photos -> 3D Gaussians -> frames for any camera, and a PLY export.

The job skeleton (checkpoints, resume, evaluation artifacts, renders, camera paths) is
worker.jobs.scene's; this module adds the Gaussian trainer, rasterising one view, and the
3DGS PLY of the trained Gaussians in the dataset's world units.
"""

from __future__ import annotations

import torch

from worker.jobs.scene import SceneJob, SceneModel
from worker.scene.cameras import RenderCamera, world_distance
from worker.scene.dataset import Dataset
from worker.scene.evaluate import evaluate as evaluate_views
from worker.scene.pinhole import to_pinhole
from worker.splat import model as gm
from worker.splat.ply import ply_bytes
from worker.splat.trainer import SplatTrainer, to_numpy

PLY_NAME = "point_cloud.ply"


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
