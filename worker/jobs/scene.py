"""The job skeleton every scene kind (nerf, splat) shares: training with checkpoints and resume,
the test-split evaluation and its artifacts, and rendering frames and camera paths from a
checkpoint. A kind subclasses SceneJob with what differs: its trainer, how it renders one view,
and what it builds from a checkpoint.

Evaluation artifacts: `test_NNN.png` (the first `n_test_renders` views), `results.json` (every
test view's name, stride and scores, and the means) and `test_renders.zip` (every test view as
`rgb/<name>.png` and `depth/<name>.png`, 16-bit millimetres of world distance), at the pixel
stride the budget allowed (worker/budget.py).
"""

from __future__ import annotations

import json
import logging
import time
import zipfile
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch

from api_schemas.jobs import JobKind
from api_schemas.kinds import CONFIG_MODELS
from api_schemas.render import PathRequest, RenderRequest
from core.storage import atomic_write_bytes
from worker.budget import EvalPlan, TimeBudget, time_limit
from worker.configs import checkpoint_config, trained_config
from worker.jobs import RenderError, pick_device
from worker.scene.cameras import RenderCamera, world_distance
from worker.scene.dataset import Dataset, background_rgb, read_meta
from worker.scene.encode import CONTENT_TYPES, depth_png16, encode_frames, encode_image, to_uint8
from worker.scene.evaluate import ViewResult, colour_warning, evaluate
from worker.scene.metrics import lpips_metric
from worker.scene.requests import (
    PATH_PIXEL_BUDGET_FRAMES,
    encode_output,
    output_pixels,
    path_cameras,
    path_length,
    resolve_request_camera,
)

log = logging.getLogger(__name__)
RESULTS_NAME = "results.json"
TILE_PIXELS = 16_384  # a frame render job's band of rows: progress about this often
RENDERS_ZIP = "test_renders.zip"


def planned_steps(step: int, start: tuple[int, float], used_s: float, end_s: float) -> int:
    """The step a run that trains until `end_s` of its budget will reach, at the pace since
    `start` (step, budget seconds used then); at least one more than `step`."""
    done, spent = step - start[0], used_s - start[1]
    if done <= 0 or spent <= 0:
        return step + 1
    return step + max(1, round(done / spent * max(end_s - used_s, 0.0)))


class SceneModel:
    """What a render needs, built once per checkpoint and kept in `checkpoint.cache`."""

    def __init__(self, checkpoint, device):
        meta = checkpoint.meta
        # The config the checkpoint was trained with (not the job's: the two may differ)
        self.config = trained_config(CONFIG_MODELS[JobKind(meta["kind"])], meta["config"])
        self.device = device
        self.normalization = meta["normalization"]
        cam = meta["camera"]
        # What request cameras resolve against: the normalisation, the dataset's up (look_at and
        # orbit default) and a training camera (the default field of view).
        self.camera_meta = {
            "normalization": self.normalization,
            "world_up": meta.get("world_up"),
            "frames": [{"fx": cam["fx"], "w": cam["w"], "split": "train"}],
        }
        # nerfstudio camera paths may be in nerfstudio's frame, made from every dataset camera
        self.camera_meta["dataset_dir"] = str(Path(checkpoint.path).parent.parent / "dataset")

    def background(self, request: RenderRequest | PathRequest) -> torch.Tensor:
        spec = request.background
        rgb = background_rgb(spec if spec is not None else self.config.background)
        return torch.tensor(rgb, device=self.device)


class SceneJob:
    kind = ""
    model_class = SceneModel

    # -- what a kind provides ------------------------------------------------------------------
    def make_trainer(self, ctx, meta: dict[str, Any], data: Dataset):
        raise NotImplementedError

    def dataset(self, ctx, split: str, meta: dict[str, Any]) -> Dataset:
        """The frames of one split as this kind trains on and scores them."""
        return Dataset(ctx.paths.dataset, split, meta)

    def render_test_view(self, trainer, data: Dataset, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Frame i of `data` on the evaluation background: rgb (H, W, 3) and world depth (H, W)."""
        raise NotImplementedError

    def render_test_view_at(self, trainer, data: Dataset, i: int, stride: int):
        """render_test_view's pixels at every `stride`-th pixel of every stride-th row; a kind
        that can render only those (nerf: their rays) overrides this to save the time."""
        rgb, depth = self.render_test_view(trainer, data, i)
        if stride == 1:
            return rgb, depth
        return rgb[::stride, ::stride], None if depth is None else depth[::stride, ::stride]

    def render_view(self, model, cam: RenderCamera, background: torch.Tensor, output: str):
        """rgb (H, W, 3), depth (H, W) in the normalised frame (0 where empty; only needed when
        output is depth), alpha (H, W), as numpy."""
        raise NotImplementedError

    def report(self, ctx, trainer, last: dict[str, float], force: bool = False, **extra) -> None:
        ctx.progress.report(
            trainer.step,
            getattr(trainer, "planned_steps", None) or ctx.config.steps or trainer.step,
            loss=last.get("loss"),
            psnr=last.get("psnr"),
            force=force,
            checkpoint_step=ctx.checkpoints.saved_step,
            **extra,
        )

    def after_step(self, trainer, test: Dataset) -> None:
        """Hook after every training step (nerf measures its quality curve here)."""

    def before_evaluation(self, trainer, test: Dataset) -> None:
        """Hook before the final evaluation (nerf measures its render speed here when no curve
        point did)."""

    def final_metrics(self, ctx, trainer, test: Dataset, metrics: dict[str, Any]) -> list[str]:
        """Kind-specific metrics added to `metrics`; returns further artifact names written."""
        return []

    # -- training --------------------------------------------------------------------------------
    def resume(self, ctx, trainer) -> None:
        ckpt = ctx.checkpoints.load_latest()
        if ckpt is None:
            return
        if (
            ckpt.meta.get("kind") != self.kind
            or ckpt.meta.get("state_format") != getattr(trainer, "state_format", None)
            or checkpoint_config(CONFIG_MODELS[JobKind(self.kind)], ckpt) != ctx.config
        ):
            log.warning(
                "job %s: checkpoint step %s does not match this config; starting over",
                ctx.job.id,
                ckpt.step,
            )
            return
        trainer.load_state(ckpt.tensors, ckpt.meta)
        trainer.budget_spent = ckpt.meta.get("budget_spent")
        ctx.checkpoints.saved_step = ckpt.step
        log.info("job %s: resumed from checkpoint step %s", ctx.job.id, trainer.step)

    def _checkpoint(self, ctx, trainer, budget: TimeBudget) -> None:
        t0 = time.perf_counter()
        trainer.budget_used_s = budget.used()
        tensors, meta = trainer.state()
        ctx.checkpoints.save(trainer.step, tensors, {**meta, "budget_spent": budget.spent})
        budget.spent["checkpoint"] += time.perf_counter() - t0

    def train(self, ctx) -> dict[str, Any]:
        config = ctx.config
        meta = read_meta(ctx.paths.dataset)
        trainer = self.make_trainer(ctx, meta, self.dataset(ctx, "train", meta))
        test = self.dataset(ctx, "test", meta)
        self.resume(ctx, trainer)
        steps = config.steps  # None: until the budget's training time ends
        # Wall time from the start of training (worker/budget.py): curve points, checkpoints and
        # the final evaluation count; earlier runs of a resumed job too.
        budget = TimeBudget(
            time_limit(config.time_limit_s, ctx.device),
            getattr(trainer, "budget_used_s", 0.0),
            getattr(trainer, "budget_spent", None),
        )
        trainer.time_budget = budget
        test_pixels = [f.w * f.h for f in test.frames]
        ctx.progress.start_step = trainer.step
        ctx.progress.set_deadline(budget.left())
        start = (trainer.step, budget.used())
        trainer.planned_steps = steps or trainer.step + 1
        ctx.progress.report(trainer.step, trainer.planned_steps, force=True)
        last: dict[str, float] = {}
        while (steps is None or trainer.step < steps) and budget.used() < budget.training_end(
            test_pixels
        ):
            ctx.raise_if_cancelled()
            trainer.lr_horizon_s = budget.training_end(test_pixels)
            trainer.budget_used_s = budget.used()
            last = trainer.train_step()
            if steps is None:  # progress counts towards the steps the budget will have held
                trainer.planned_steps = planned_steps(
                    trainer.step, start, budget.used(), trainer.lr_horizon_s
                )
            # This run's first step is reported at once: the first loss and PSNR are there to
            # see, and later ones compare with where training started, whatever the step speed.
            self.report(ctx, trainer, last, force=trainer.step == ctx.progress.start_step + 1)
            t0 = time.perf_counter()
            self.after_step(trainer, test)
            budget.spent["curve"] += time.perf_counter() - t0
            if (steps is None or trainer.step < steps) and ctx.checkpoints.due(
                marked=trainer.step % config.checkpoint_every == 0
            ):
                self._checkpoint(ctx, trainer, budget)
        self._checkpoint(ctx, trainer, budget)
        trainer.planned_steps = trainer.step
        self.report(ctx, trainer, last, force=True)

        ctx.raise_if_cancelled()
        t0 = time.perf_counter()
        self.before_evaluation(trainer, test)
        plan = EvalPlan(budget, test_pixels)
        metrics, names = self.evaluate_and_store(ctx, trainer, test, plan=plan)
        names += self.final_metrics(ctx, trainer, test, metrics)
        budget.spent["eval"] += time.perf_counter() - t0
        warning = colour_warning(metrics)
        if warning:
            metrics["warnings"] = [warning]
        metrics.update(
            {
                "steps": trainer.step,
                "train_s": round(trainer.train_s, 3),
                "eval_s": round(time.perf_counter() - t0, 3),
                "eval_views": metrics["n_test"],
                "eval_scale": round(plan.scale, 4),
                "curve_s": round(budget.spent["curve"], 3),
                "checkpoint_s": round(budget.spent["checkpoint"], 3),
                "budget_shares": budget.shares(trainer.train_s),
                "render_pixels_per_s": plan.pixels_per_s,
                "time_limit_s": budget.limit_s,
                "budget_used_s": round(budget.used(), 3),
                "train_psnr": last.get("psnr"),
                "artifacts": names,
            }
        )
        return metrics

    # -- evaluation ------------------------------------------------------------------------------
    def evaluate_and_store(
        self, ctx, trainer, test: Dataset, plan: EvalPlan | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """Scores every test view (at the pixel strides of `plan`) and writes the evaluation
        artifacts (module docstring)."""
        art = ctx.paths.artifacts
        art.mkdir(parents=True, exist_ok=True)
        lpips, lpips_absent = lpips_metric(ctx.settings.lpips_model)
        rows: list[dict] = []
        names: list[str] = []
        keep = ctx.config.n_test_renders
        tmp_zip = art / f".{RENDERS_ZIP}.tmp"
        with zipfile.ZipFile(tmp_zip, "w", zipfile.ZIP_STORED) as zf:

            def store(view: ViewResult) -> None:
                rows.append(view.row)
                stem = PurePosixPath(view.name).stem
                zf.writestr(f"rgb/{stem}.png", encode_image(to_uint8(view.rgb), "png"))
                if view.depth is not None:
                    zf.writestr(f"depth/{stem}.png", depth_png16(view.depth, view.depth > 0))
                if view.index < keep:
                    name = f"test_{view.index:03d}.png"
                    atomic_write_bytes(
                        art / name,
                        encode_image(to_uint8(view.rgb), "png", {"source": view.name}),
                    )
                    names.append(name)

            metrics, _ = evaluate(
                lambda i, stride=1: self.render_test_view_at(trainer, test, i, stride),
                test,
                trainer.eval_background,
                lpips=lpips,
                on_view=store,
                plan=plan,
            )
        tmp_zip.replace(art / RENDERS_ZIP)
        means = {k: round(v, 5) for k, v in metrics.items() if k.startswith("test_")}
        results = {"views": rows, "mean": means, "n_test": metrics["n_test"]}
        if lpips_absent:
            results["lpips_absent"] = lpips_absent
            metrics["lpips_absent"] = lpips_absent
        atomic_write_bytes(art / RESULTS_NAME, json.dumps(results, indent=1).encode())
        return metrics, names + [RESULTS_NAME, RENDERS_ZIP]

    # -- rendering -------------------------------------------------------------------------------
    def model_for(self, checkpoint) -> tuple[Any, bool]:
        model = checkpoint.cache.get(self.kind)
        if model is not None:
            return model, True
        if checkpoint.meta.get("kind") != self.kind:
            raise RenderError(409, f"the job's checkpoint is not a {self.kind} checkpoint")
        model = self.model_class(checkpoint, pick_device())
        checkpoint.cache[self.kind] = model
        return model, False

    def _frame(self, model, cam: RenderCamera, request: RenderRequest | PathRequest):
        rgb, depth, alpha = self.render_view(model, cam, model.background(request), request.output)
        return rgb, world_distance(depth, model.normalization), alpha

    def render(
        self, job, checkpoint, request: RenderRequest | dict[str, Any], on_pixels=None
    ) -> tuple[bytes, str]:
        """One frame, encoded. With `on_pixels(done, total)` (a frame render job) it renders in
        bands of rows of about TILE_PIXELS and reports after each; the frame is the same."""
        request = RenderRequest.model_validate(request)  # the task's typed request, or a dict
        model, hit = self.model_for(checkpoint)
        cam = resolve_request_camera(request, model.camera_meta)
        text = {
            "nf-model-cache": "hit" if hit else "miss",
            "nf-checkpoint-step": str(checkpoint.step),
        }
        if on_pixels is None:
            rgb, depth, alpha = self._frame(model, cam, request)
        else:
            rows = max(1, TILE_PIXELS // cam.width)
            bands = []
            for y0 in range(0, cam.height, rows):
                h = min(rows, cam.height - y0)
                bands.append(self._frame(model, replace(cam, cy=cam.cy - y0, height=h), request))
                on_pixels((y0 + h) * cam.width, cam.width * cam.height)
            rgb, depth, alpha = (np.concatenate(parts) for parts in zip(*bands))
        return encode_output(rgb, depth, alpha, request.output, request.format, text)

    def render_frame_to(self, job, checkpoint, request: RenderRequest, on_pixels):
        """A frame render job's frame: render() in bands, `on_pixels(done, total)` after each."""
        return self.render(job, checkpoint, request, on_pixels)

    def path_frames(self, checkpoint, request: PathRequest, budget: bool = True):
        """(frame count, iterator of uint8 frames) of a PathRequest; RenderError for bad paths."""
        width, height, n = path_length(request)
        if budget:
            from core.settings import get_settings

            limit = PATH_PIXEL_BUDGET_FRAMES * get_settings().max_render_pixels
            if n * width * height > limit:
                raise RenderError(
                    422,
                    f"{n} frames of {width}x{height} is over the path budget of {limit} pixels "
                    f"({PATH_PIXEL_BUDGET_FRAMES} x MAX_RENDER_PIXELS); use fewer or smaller "
                    "frames, or render it as a path job",
                )
        model, _ = self.model_for(checkpoint)
        cams = path_cameras(request, model.camera_meta)
        output = request.output

        def frames():
            for cam in cams:
                yield output_pixels(*self._frame(model, cam, request), output)[0]

        return len(cams), frames()

    def render_path(
        self, job, checkpoint, request: PathRequest | dict[str, Any]
    ) -> tuple[bytes, str]:
        request = PathRequest.model_validate(request)  # the task's typed request, or a dict
        _, frames = self.path_frames(checkpoint, request)
        fmt = request.format
        return encode_frames(frames, fmt, request.frames_per_second), CONTENT_TYPES[fmt]

    def render_path_to(
        self, job, checkpoint, request: PathRequest | dict[str, Any], out, on_frame
    ) -> str:
        """A path job: frames written to the file `out` as they render (MP4 and zip hold one
        frame at a time), `on_frame(done, total)` after each; returns the content type."""
        request = PathRequest.model_validate(request)  # the task's typed request, or a dict
        n, frames = self.path_frames(checkpoint, request, budget=False)

        def counted():
            for i, frame in enumerate(frames):
                yield frame
                on_frame(i + 1, n)

        encode_frames(counted(), request.format, request.frames_per_second, out=out)
        return CONTENT_TYPES[request.format]
