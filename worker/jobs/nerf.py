"""kind=nerf: posed photos -> instant-ngp-style radiance field -> frames for any camera.

train(ctx) runs worker.nerf.trainer.NerfTrainer with checkpoints and resume; render /
render_path serve cameras given in the dataset's own world frame (the stored normalisation is
applied here). The model built from a checkpoint is kept in `checkpoint.cache`; PNG renders
carry a `nf-model-cache: hit|miss` text chunk so clients (and tests) can see whether a request
reused it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from worker.cameras import path_cameras, resolve_request_camera, world_distance
from worker.jobs import RenderError, pick_device
from worker.jobs.scene_render import PATH_PIXEL_BUDGET_FRAMES, clean_camera, output_pixels
from worker.nerf.data import Dataset, background_rgb, read_meta
from worker.nerf.encode import CONTENT_TYPES, encode_frames, encode_image, to_uint8
from worker.nerf.evaluate import background_psnr, evaluate
from worker.nerf.model import NerfField
from worker.nerf.rendering import render_image
from worker.nerf.trainer import NerfTrainer, load_field_and_grid

log = logging.getLogger(__name__)
CURVE_FRAMES = 10
CURVE_INTERVAL_S = 30.0  # training seconds between test-PSNR curve points


# -- training --------------------------------------------------------------------------------
def _resume(ctx, trainer: NerfTrainer) -> None:
    ckpt = ctx.checkpoints.load_latest()
    if ckpt is None:
        return
    if ckpt.meta.get("kind") != "nerf" or ckpt.meta.get("config") != ctx.config:
        log.warning(
            "job %s: checkpoint step %s does not match this config; starting over",
            ctx.job.id,
            ckpt.step,
        )
        return
    trainer.load_state(ckpt.tensors, ckpt.meta)
    log.info("job %s: resumed from checkpoint step %s", ctx.job.id, trainer.step)


def _report(ctx, step: int, steps: int, last: dict[str, float], force: bool = False) -> None:
    if not last:
        ctx.progress.report(step, steps, force=force)
        return
    ctx.progress.report(
        step,
        steps,
        loss=last["loss"],
        psnr=last["psnr"],
        force=force,
        rays_per_s=round(last["rays"] / max(last["seconds"], 1e-9), 1),
        samples_per_ray=round(last["samples_per_ray"], 2),
    )


def train(ctx) -> dict[str, Any]:
    config = ctx.config
    meta = read_meta(ctx.paths.dataset)
    data = Dataset(ctx.paths.dataset, "train", meta)
    test = Dataset(ctx.paths.dataset, "test", meta)
    trainer = NerfTrainer(config, meta, ctx.device, data)
    _resume(ctx, trainer)
    steps = config["steps"]
    limit = config.get("time_limit_s")
    ctx.progress.start_step = trainer.step
    ctx.progress.report(trainer.step, steps, force=True)
    last: dict[str, float] = {}
    next_curve = trainer.train_s + CURVE_INTERVAL_S
    while trainer.step < steps and not (limit and trainer.train_s >= limit):
        ctx.raise_if_cancelled()
        last = trainer.train_step()
        _report(ctx, trainer.step, steps, last)
        if trainer.train_s >= next_curve:
            _curve_point(trainer, test)
            next_curve = trainer.train_s + CURVE_INTERVAL_S
        if trainer.step < steps and (
            trainer.step % config["checkpoint_every"] == 0 or ctx.checkpoints.due()
        ):
            ctx.checkpoints.save(trainer.step, *trainer.state())
    ctx.checkpoints.save(trainer.step, *trainer.state())
    _report(ctx, trainer.step, steps, last, force=True)

    ctx.raise_if_cancelled()
    t0 = time.perf_counter()
    metrics, renders = evaluate(trainer, test, keep=config["n_test_renders"])
    names = _save_test_renders(ctx, test, renders)
    if trainer.curve and trainer.curve[-1]["step"] == trainer.step:
        trainer.curve.pop()  # the last curve point, maybe measured on fewer frames
    trainer.curve.append(
        {
            "step": trainer.step,
            "train_s": round(trainer.train_s, 2),
            "test_psnr": round(metrics["test_psnr"], 3),
        }
    )
    metrics.update(
        {
            "background_psnr": round(background_psnr(trainer, test), 3),
            "steps": trainer.step,
            "train_s": round(trainer.train_s, 3),
            "eval_s": round(time.perf_counter() - t0, 3),
            "train_psnr": last.get("psnr"),
            "artifacts": names,
            "curve": trainer.curve,
        }
    )
    return metrics


def _curve_point(trainer: NerfTrainer, test: Dataset) -> None:
    """Test PSNR every CURVE_INTERVAL_S of training (first CURVE_FRAMES test views; the evaluation
    is not counted in train_s):
    how quality grows with training time, which the quality script compares across backends."""
    m, _ = evaluate(trainer, test, limit=CURVE_FRAMES)
    trainer.curve.append(
        {
            "step": trainer.step,
            "train_s": round(trainer.train_s, 2),
            "test_psnr": round(m["test_psnr"], 3),
        }
    )


def _save_test_renders(ctx, test: Dataset, renders) -> list[str]:
    ctx.paths.artifacts.mkdir(parents=True, exist_ok=True)
    names = []
    for i, img in renders:
        name = f"test_{i:03d}.png"
        (ctx.paths.artifacts / name).write_bytes(
            encode_image(to_uint8(img), "png", {"source": test.frames[i].file})
        )
        names.append(name)
    return names


# -- rendering -------------------------------------------------------------------------------
class _Model:
    """What a render needs, built once per checkpoint and kept in checkpoint.cache."""

    def __init__(self, checkpoint, device):
        meta = checkpoint.meta
        self.config = meta["config"]
        self.device = device
        self.field = NerfField(self.config, meta["aabb_half"]).eval()
        from kernels import OccupancyGrid

        self.grid = OccupancyGrid(
            [-meta["aabb_half"]] * 3 + [meta["aabb_half"]] * 3,
            resolution=meta["grid"]["resolution"],
            n_cascades=meta["grid"]["n_cascades"],
            step_size=meta["step_size"],
            backend=self.config.get("backend", "ext"),
        )
        load_field_and_grid(self.field, self.grid, checkpoint.tensors, device)
        self.step_size = meta["step_size"]
        self.normalization = meta["normalization"]
        cam = meta["camera"]
        # What worker.cameras needs to resolve request cameras: the normalisation, the dataset's
        # up (look_at/orbit default) and a training camera (default field of view).
        self.camera_meta = {
            "normalization": self.normalization,
            "world_up": meta.get("world_up"),
            "frames": [{"fx": cam["fx"], "w": cam["w"], "split": "train"}],
        }
        self.background = None
        self.renders = 0


def _model_for(checkpoint) -> tuple[_Model, bool]:
    model = checkpoint.cache.get("nerf")
    if model is not None:
        return model, True
    if checkpoint.meta.get("kind") != "nerf":
        raise RenderError(409, "the job's checkpoint is not a nerf checkpoint")
    model = _Model(checkpoint, pick_device())
    checkpoint.cache["nerf"] = model
    return model, False


def _background(request: dict[str, Any], model: _Model) -> tuple[float, float, float]:
    spec = request.get("background")
    return background_rgb(spec if spec is not None else model.config.get("background"))


def _render_one(model: _Model, cam):
    """rgb (H, W, 3), depth (H, W) in world units (0 where nothing was hit), alpha (H, W)."""
    o, d = cam.rays(model.device)
    rgb, depth, alpha, _ = render_image(
        model.field,
        model.grid,
        o,
        d,
        model.background,
        step=model.step_size,
        cone_angle=model.config["cone_angle"],
        max_samples=model.config["max_samples_per_ray"],
    )
    model.renders += 1
    h, w = cam.height, cam.width
    return (
        rgb.reshape(h, w, 3).cpu().numpy(),
        world_distance(depth, model.normalization).reshape(h, w).cpu().numpy(),
        alpha.reshape(h, w).cpu().numpy(),
    )


def _setup(checkpoint, request: dict[str, Any]) -> tuple[_Model, bool]:
    model, hit = _model_for(checkpoint)
    model.background = torch.tensor(_background(request, model), device=model.device)
    return model, hit


def render(job, checkpoint, request: dict[str, Any]) -> tuple[bytes, str]:
    request = {**request, "camera": clean_camera(request.get("camera"), "camera")}
    model, hit = _setup(checkpoint, request)
    cam = resolve_request_camera(request, model.camera_meta)
    pixels, text = output_pixels(*_render_one(model, cam), request.get("output", "rgb"))
    fmt = request.get("format", "png")
    text.update(
        {"nf-model-cache": "hit" if hit else "miss", "nf-checkpoint-step": str(checkpoint.step)}
    )
    return encode_image(pixels, fmt, text), CONTENT_TYPES[fmt]


def render_path(job, checkpoint, request: dict[str, Any]) -> tuple[bytes, str]:
    fmt = request.get("format", "webp")
    if fmt not in ("webp", "zip", "gif"):
        raise RenderError(422, f"format {fmt!r} is not available here; use webp, gif or zip")
    if request.get("poses") is not None:
        request = {
            **request,
            "poses": [clean_camera(c, f"poses[{i}]") for i, c in enumerate(request["poses"])],
        }
    elif request.get("orbit") is None:
        raise RenderError(422, "give poses or an orbit")
    width, height = int(request["width"]), int(request["height"])
    n = (
        len(request["poses"])
        if request.get("poses") is not None
        else int(request["orbit"].get("n_frames", 36))
    )
    from core.settings import get_settings

    budget = PATH_PIXEL_BUDGET_FRAMES * get_settings().max_render_pixels
    if n * width * height > budget:
        raise RenderError(
            422,
            f"{n} frames of {width}x{height} is over the path budget of {budget} "
            f"pixels ({PATH_PIXEL_BUDGET_FRAMES} x MAX_RENDER_PIXELS); use fewer or smaller frames",
        )
    model, _ = _setup(checkpoint, request)
    output = request.get("output", "rgb")
    frames = [
        output_pixels(*_render_one(model, cam), output)[0]
        for cam in path_cameras(request, model.camera_meta)
    ]
    return encode_frames(frames, fmt, int(request.get("fps", 24))), CONTENT_TYPES[fmt]
