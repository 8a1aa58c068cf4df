"""kind=nerf: posed photos -> instant-ngp-style radiance field -> frames for any camera.

The job skeleton (checkpoints, resume, evaluation artifacts, renders, camera paths) is
worker.jobs.scene's; this module adds the NeRF trainer, its throughput progress, the test-PSNR
curve over training time, and ray-marched rendering of one view. PNG renders carry a
`nf-model-cache: hit|miss` text chunk so clients (and tests) can see whether a request reused
the model built from the checkpoint.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from worker.jobs.scene import SceneJob, SceneModel
from worker.nerf.model import NerfField
from worker.nerf.rendering import render_image
from worker.nerf.trainer import NerfTrainer, cone_angle, load_field_and_grid
from worker.scene.cameras import RenderCamera, world_distance
from worker.scene.dataset import Dataset
from worker.scene.evaluate import background_psnr, evaluate

CURVE_FRAMES = 10
CURVE_INTERVAL_S = 30.0  # training seconds between test-PSNR curve points


@contextmanager
def measured_with_kernels(trainer):
    """Evaluate with the compiled kernels even when training runs on the references: the ops
    are parity-tested, so the numbers are the same, and a reference-backend run is not slowed
    down further (or its curve made sparser) by its own measurements."""
    from kernels import compiled_available

    if not compiled_available(trainer.field.encoding.params.device):
        yield
        return
    saved = trainer.field.backend, trainer.field.encoding.backend, trainer.grid.backend
    trainer.field.backend = trainer.field.encoding.backend = trainer.grid.backend = "ext"
    try:
        yield
    finally:
        trainer.field.backend, trainer.field.encoding.backend, trainer.grid.backend = saved


class NerfModel(SceneModel):
    def __init__(self, checkpoint, device):
        super().__init__(checkpoint, device)
        meta = checkpoint.meta
        # The cone angle and table size the run resolved from its scene (box, training pixels).
        self.config = {
            **self.config,
            "cone_angle": meta.get("cone_angle", cone_angle(self.config, meta["aabb_half"])),
            "log2_hashmap_size": meta.get("log2_hashmap_size", self.config["log2_hashmap_size"]),
        }
        self.cone_angle = self.config["cone_angle"]
        self.field = NerfField(self.config, meta["aabb_half"]).eval()
        from kernels import OccupancyGrid

        # Cascade 0's half size: checkpoints before cascades (state format 2) had one cascade over
        # the whole box and no "half".
        grid_half = meta["grid"].get("half", meta["aabb_half"])
        self.grid = OccupancyGrid(
            [-grid_half] * 3 + [grid_half] * 3,
            resolution=meta["grid"]["resolution"],
            n_cascades=meta["grid"]["n_cascades"],
            step_size=meta["step_size"],
            backend=self.config.get("backend", "ext"),
        )
        load_field_and_grid(self.field, self.grid, checkpoint.tensors, device)
        self.step_size = meta["step_size"]
        self.max_step = float(meta.get("max_step", 1e10))


def _march(field, grid, config, step_size, o, d, background, max_step=1e10):
    return render_image(
        field,
        grid,
        o,
        d,
        background,
        step=step_size,
        cone_angle=config["cone_angle"],
        max_samples=config["max_samples_per_ray"],
        max_step=max_step,
    )


class NerfJob(SceneJob):
    kind = "nerf"
    model_class = NerfModel

    def make_trainer(self, ctx, meta, data):
        return NerfTrainer(ctx.config, meta, ctx.device, data)

    def report(self, ctx, trainer, last, force=False, **extra):
        if last:
            extra["rays_per_s"] = round(last["rays"] / max(last["seconds"], 1e-9), 1)
            extra["samples_per_ray"] = round(last["samples_per_ray"], 2)
        super().report(ctx, trainer, last, force, **extra)

    def _view(self, trainer, data: Dataset, i: int):
        f = data.frames[i]
        o, d = data.frame_rays(i)
        dev = trainer.device
        with measured_with_kernels(trainer):
            rgb, depth, _, _ = _march(
                trainer.field,
                trainer.grid,
                trainer.config,
                trainer.step_size,
                o.to(dev),
                d.to(dev),
                trainer.eval_background,
                trainer.max_step,
            )
        depth = world_distance(depth, data.normalization)
        return (
            rgb.clamp(0, 1).reshape(f.h, f.w, 3).cpu().numpy(),
            depth.reshape(f.h, f.w).cpu().numpy(),
        )

    def render_test_view(self, trainer, data, i):
        trainer.field.eval()
        return self._view(trainer, data, i)

    def after_step(self, trainer, test):
        """Test PSNR every CURVE_INTERVAL_S of training on the first CURVE_FRAMES test views (not
        counted in train_s, but in the job's time budget): how quality grows with training time,
        which the quality script compares across backends. Curve points cost at most a tenth of
        the training time, however large the frames."""
        due = getattr(trainer, "next_curve_s", None)
        if due is None:
            trainer.next_curve_s = due = trainer.train_s + CURVE_INTERVAL_S
        if trainer.train_s < due:
            return
        trainer.field.eval()
        t0 = time.perf_counter()
        m, _ = evaluate(
            lambda i: self._view(trainer, test, i),
            test,
            trainer.eval_background,
            limit=CURVE_FRAMES,
        )
        spent = time.perf_counter() - t0
        budget = getattr(trainer, "time_budget", None)
        if budget is not None:
            budget.eval_s_per_frame = spent / max(m["n_test"], 1)
        trainer.curve.append(
            {
                "step": trainer.step,
                "train_s": round(trainer.train_s, 2),
                "test_psnr": round(m["test_psnr"], 3),
            }
        )
        trainer.next_curve_s = trainer.train_s + max(CURVE_INTERVAL_S, 10 * spent)

    def final_metrics(self, ctx, trainer, test, metrics):
        if trainer.curve and trainer.curve[-1]["step"] == trainer.step:
            trainer.curve.pop()  # the last curve point, maybe measured on fewer frames
        trainer.curve.append(
            {
                "step": trainer.step,
                "train_s": round(trainer.train_s, 2),
                "test_psnr": round(metrics["test_psnr"], 3),
            }
        )
        floor = background_psnr(test, trainer.eval_background)
        if floor is not None:
            metrics["background_psnr"] = round(floor, 3)
        metrics["curve"] = trainer.curve
        return []

    def render_view(self, model: NerfModel, cam: RenderCamera, background, output):
        o, d = cam.rays(model.device)
        rgb, depth, alpha, _ = _march(
            model.field, model.grid, model.config, model.step_size, o, d, background, model.max_step
        )
        h, w = cam.height, cam.width
        return (
            rgb.reshape(h, w, 3).cpu().numpy(),
            depth.reshape(h, w).cpu().numpy(),
            alpha.reshape(h, w).cpu().numpy(),
        )


JOB = NerfJob()
