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

import torch

from api_schemas.nerf import NerfConfig
from worker.budget import CURVE_SHARE
from worker.jobs.scene import SceneJob, SceneModel
from worker.nerf.model import NerfField
from worker.nerf.rendering import render_image
from worker.nerf.trainer import NerfTrainer, cone_angle, load_field_and_grid
from worker.scene.cameras import RenderCamera, world_distance
from worker.scene.dataset import Dataset, composite_background
from worker.scene.evaluate import background_psnr
from worker.scene.metrics import psnr_from_mse

CURVE_PIXELS = 4096  # the fixed subsample of test pixels every curve point renders
PROBE_PIXELS = 1024  # the render-speed probe before an evaluation no curve point measured for
CURVE_INTERVAL_S = 30.0  # training seconds between test-PSNR curve points (at most)
# The first point comes early (it also measures the render speed the final evaluation plans
# with), though not before the occupancy grid's warm-up (until then every sample of every ray
# is evaluated: a point costs many times what it will), and short budgets get points more often.
CURVE_FIRST_SHARE, CURVE_SHARE_BETWEEN, CURVE_LATEST_SHARE = 0.05, 0.1, 0.25


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
        self.config = self.config.model_copy(
            update={
                "cone_angle": meta.get("cone_angle", cone_angle(self.config, meta["aabb_half"])),
                "log2_hashmap_size": meta.get("log2_hashmap_size", self.config.log2_hashmap_size),
                # checkpoints without one were trained with rays from the camera on
                "near_distance": meta.get("near_distance", self.config.near_distance or 0.0),
            }
        )
        self.cone_angle = self.config.cone_angle
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
            backend=self.config.backend,
        )
        load_field_and_grid(self.field, self.grid, checkpoint.tensors, device)
        self.step_size = meta["step_size"]
        self.max_step = float(meta.get("max_step", 1e10))


def _march(field, grid, config: NerfConfig, step_size, o, d, background, max_step=1e10):
    return render_image(
        field,
        grid,
        o,
        d,
        background,
        step=step_size,
        cone_angle=config.cone_angle,
        max_samples=config.max_samples_per_ray,
        max_step=max_step,
        alpha_threshold=config.alpha_threshold,
        near=config.near_distance,
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

    def _view(self, trainer, data: Dataset, i: int, stride: int = 1):
        f = data.frames[i]
        o, d = data.frame_rays(i)
        h, w = f.h, f.w
        if stride > 1:
            o = o.reshape(h, w, 3)[::stride, ::stride].reshape(-1, 3)
            d = d.reshape(h, w, 3)[::stride, ::stride].reshape(-1, 3)
            h, w = -(-h // stride), -(-w // stride)
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
            rgb.clamp(0, 1).reshape(h, w, 3).cpu().numpy(),
            depth.reshape(h, w).cpu().numpy(),
        )

    def render_test_view(self, trainer, data, i):
        trainer.field.eval()
        return self._view(trainer, data, i)

    def render_test_view_at(self, trainer, data, i, stride):
        trainer.field.eval()
        return self._view(trainer, data, i, stride)

    @staticmethod
    def _curve_rays(trainer, test: Dataset):
        """The curve's fixed test pixels (the same every point, drawn once from seed 0 over the
        pixels the masks keep): origins, directions, targets on the evaluation background."""
        cached = getattr(trainer, "curve_rays", None)
        if cached is not None:
            return cached
        g = torch.Generator().manual_seed(0)
        pool = torch.arange(test.n_pixels) if test.keep is None else test.keep.nonzero().flatten()
        if len(pool) > CURVE_PIXELS:
            # random order: a point on the first n of them still samples every view
            pool = pool[torch.randperm(len(pool), generator=g)[:CURVE_PIXELS]]
        o, d, rgba = test.rays_of(pool)
        target = composite_background(rgba, trainer.eval_background.cpu())
        trainer.curve_rays = (o.to(trainer.device), d.to(trainer.device), target)
        return trainer.curve_rays

    def after_step(self, trainer, test):
        """A test-PSNR curve point (`{step, train_s, test_psnr}`) on a fixed subsample of
        CURVE_PIXELS test pixels of every test view, in the job's time budget and not in
        train_s: how quality grows with training time, which the quality script compares across
        backends, and the render speed the final evaluation plans with. Points come every
        CURVE_INTERVAL_S of training (sooner in short budgets) and take at most CURVE_SHARE of
        the training time (fewer pixels when rendering is slow)."""
        budget = getattr(trainer, "time_budget", None)
        limit = budget.limit_s if budget is not None else float("inf")
        due = getattr(trainer, "next_curve_s", None)
        if due is None:
            trainer.next_curve_s = due = trainer.train_s + min(
                CURVE_INTERVAL_S, CURVE_FIRST_SHARE * limit
            )
        warming = trainer.step < trainer.config.occupancy_warmup_steps
        # A worker so slow that the warm-up outlasts a quarter of the budget measures anyway
        # (pessimistically: the evaluation then keeps more room, which such a worker needs).
        if trainer.train_s < due or (warming and trainer.train_s < CURVE_LATEST_SHARE * limit):
            return
        interval = min(CURVE_INTERVAL_S, CURVE_SHARE_BETWEEN * limit)
        # The first point probes the render speed on PROBE_PIXELS; later ones take as many of
        # the CURVE_PIXELS as CURVE_SHARE of the interval pays for (a starved worker renders
        # slowly), so no point costs much more than its share.
        rate = budget.eval_s_per_pixel if budget is not None else None
        n = PROBE_PIXELS if rate is None else int(CURVE_SHARE * interval / max(rate, 1e-12))
        spent = self._curve_point(trainer, test, min(max(n, PROBE_PIXELS), CURVE_PIXELS))
        trainer.next_curve_s = trainer.train_s + max(interval, spent / CURVE_SHARE)

    def before_evaluation(self, trainer, test):
        # The evaluation plans its resolution from the render speed a curve point measures; a
        # short probe (the final evaluation replaces its point) when training had none.
        budget = getattr(trainer, "time_budget", None)
        if budget is not None and budget.eval_s_per_pixel is None:
            self._curve_point(trainer, test, PROBE_PIXELS)

    def _curve_point(self, trainer, test, n: int = CURVE_PIXELS) -> float:
        """Appends a curve point on the first n curve pixels; returns the seconds it took (and
        sets the budget's render speed from them)."""
        trainer.field.eval()
        t0 = time.perf_counter()
        o, d, target = (x[:n] for x in self._curve_rays(trainer, test))
        with measured_with_kernels(trainer):
            rgb, _, _, _ = _march(
                trainer.field,
                trainer.grid,
                trainer.config,
                trainer.step_size,
                o,
                d,
                trainer.eval_background,
                trainer.max_step,
            )
        mse = float(((rgb.clamp(0, 1).cpu() - target) ** 2).mean())
        spent = time.perf_counter() - t0
        budget = getattr(trainer, "time_budget", None)
        if budget is not None:
            budget.eval_s_per_pixel = spent / max(len(o), 1)
        trainer.curve.append(
            {
                "step": trainer.step,
                "train_s": round(trainer.train_s, 2),
                "test_psnr": round(psnr_from_mse(mse), 3),
            }
        )
        return spent

    def final_metrics(self, ctx, trainer, test, metrics):
        if trainer.curve and trainer.curve[-1]["step"] == trainer.step:
            trainer.curve.pop()  # the last curve point, on fewer pixels than the evaluation
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
