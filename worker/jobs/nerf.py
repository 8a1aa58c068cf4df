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

import numpy as np
import torch

from worker.jobs import RenderError, pick_device
from worker.nerf.data import Dataset, background_rgb, image_rays, read_meta
from worker.nerf.encode import CONTENT_TYPES, encode_frames, encode_image, to_uint8
from worker.nerf.evaluate import background_psnr, evaluate
from worker.nerf.model import NerfField
from worker.nerf.poses import camera_c2w, intrinsics, normalize_c2w, orbit_poses
from worker.nerf.rendering import render_image
from worker.nerf.trainer import NerfTrainer, load_field_and_grid

log = logging.getLogger(__name__)
# A path may not ask for more than this many render-limit frames in total (time, memory).
PATH_PIXEL_BUDGET_FRAMES = 64
CURVE_FRAMES = 10


# -- training --------------------------------------------------------------------------------
def _resume(ctx, trainer: NerfTrainer) -> None:
    ckpt = ctx.checkpoints.load_latest()
    if ckpt is None:
        return
    if ckpt.meta.get("kind") != "nerf" or ckpt.meta.get("config") != ctx.config:
        log.warning("job %s: checkpoint step %s does not match this config; starting over", ctx.job.id, ckpt.step)
        return
    trainer.load_state(ckpt.tensors, ckpt.meta)
    log.info("job %s: resumed from checkpoint step %s", ctx.job.id, trainer.step)


def _report(ctx, step: int, steps: int, last: dict[str, float], force: bool = False) -> None:
    if not last:
        ctx.progress.report(step, steps, force=force)
        return
    ctx.progress.report(step, steps, loss=last["loss"], psnr=last["psnr"], force=force,
                        rays_per_s=round(last["rays"] / max(last["seconds"], 1e-9), 1),
                        samples_per_ray=round(last["samples_per_ray"], 2))


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
    while trainer.step < steps and not (limit and trainer.train_s >= limit):
        ctx.raise_if_cancelled()
        last = trainer.train_step()
        _report(ctx, trainer.step, steps, last)
        if trainer.step < steps and (trainer.step % config["checkpoint_every"] == 0 or ctx.checkpoints.due()):
            ctx.checkpoints.save(trainer.step, *trainer.state())
            _curve_point(trainer, test)
    ctx.checkpoints.save(trainer.step, *trainer.state())
    _report(ctx, trainer.step, steps, last, force=True)

    ctx.raise_if_cancelled()
    t0 = time.perf_counter()
    metrics, renders = evaluate(trainer, test, keep=config["n_test_renders"])
    names = _save_test_renders(ctx, test, renders)
    if trainer.curve and trainer.curve[-1]["step"] == trainer.step:
        trainer.curve.pop()  # the last checkpoint's point, measured on fewer frames
    trainer.curve.append({"step": trainer.step, "train_s": round(trainer.train_s, 2),
                          "test_psnr": round(metrics["test_psnr"], 3)})
    metrics.update({
        "background_psnr": round(background_psnr(trainer, test), 3),
        "steps": trainer.step, "train_s": round(trainer.train_s, 3), "eval_s": round(time.perf_counter() - t0, 3),
        "train_psnr": last.get("psnr"), "artifacts": names, "curve": trainer.curve,
    })
    return metrics


def _curve_point(trainer: NerfTrainer, test: Dataset) -> None:
    """Test PSNR at each checkpoint (first CURVE_FRAMES test views; not counted in train_s):
    how quality grows with training time, which the quality script compares across backends."""
    m, _ = evaluate(trainer, test, limit=CURVE_FRAMES)
    trainer.curve.append({"step": trainer.step, "train_s": round(trainer.train_s, 2),
                          "test_psnr": round(m["test_psnr"], 3)})


def _save_test_renders(ctx, test: Dataset, renders) -> list[str]:
    ctx.paths.artifacts.mkdir(parents=True, exist_ok=True)
    names = []
    for i, img in renders:
        name = f"test_{i:03d}.png"
        (ctx.paths.artifacts / name).write_bytes(encode_image(to_uint8(img), "png",
                                                              {"source": test.frames[i].file}))
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

        self.grid = OccupancyGrid([-meta["aabb_half"]] * 3 + [meta["aabb_half"]] * 3,
                                  resolution=meta["grid"]["resolution"], n_cascades=meta["grid"]["n_cascades"],
                                  step_size=meta["step_size"], backend=self.config.get("backend", "ext"))
        load_field_and_grid(self.field, self.grid, checkpoint.tensors, device)
        self.step_size = meta["step_size"]
        self.normalization = meta["normalization"]
        self.camera = meta["camera"]
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


def _render_one(model: _Model, c2w_world: np.ndarray, request: dict[str, Any], width: int, height: int):
    """rgb (H, W, 3), depth (H, W) in world units (0 where nothing was hit), alpha (H, W)."""
    fx, fy, cx, cy = intrinsics(request, width, height, model.camera)
    c2w = torch.tensor(normalize_c2w(c2w_world, model.normalization), dtype=torch.float32)
    o, d = image_rays(c2w, width, height, fx, fy, cx, cy)
    bg = torch.tensor(_background(request, model), device=model.device)
    rgb, depth, alpha, _ = render_image(model.field, model.grid, o.to(model.device), d.to(model.device), bg,
                                        step=model.step_size, cone_angle=model.config["cone_angle"],
                                        max_samples=model.config["max_samples_per_ray"])
    model.renders += 1
    scale = float(model.normalization["scale"])
    return (rgb.reshape(height, width, 3).cpu().numpy(), (depth / scale).reshape(height, width).cpu().numpy(),
            alpha.reshape(height, width).cpu().numpy())


def _output(rgb, depth, alpha, output: str) -> tuple[np.ndarray, dict[str, str]]:
    """uint8 pixels of the requested output and the PNG text that explains them."""
    if output == "rgb":
        return to_uint8(rgb), {}
    if output == "alpha":
        return to_uint8(alpha), {"nf-output": "alpha"}
    # Depth: near -> 255 ... far -> 1 (linear in world units); 0 = no surface.
    hit = alpha > 0.5
    if not hit.any():
        return np.zeros(depth.shape, np.uint8), {"nf-output": "depth", "nf-depth-near": "0", "nf-depth-far": "0"}
    near, far = float(depth[hit].min()), float(depth[hit].max())
    span = max(far - near, 1e-9)
    img = np.where(hit, 255.0 - 254.0 * (depth - near) / span, 0.0)
    return np.clip(np.round(img), 0, 255).astype(np.uint8), {
        "nf-output": "depth", "nf-depth-near": f"{near:.6g}", "nf-depth-far": f"{far:.6g}",
        "nf-depth-rule": "value = 255 - 254 * (depth - near) / (far - near); 0 = no surface; world units"}


def _camera(request: dict[str, Any]) -> np.ndarray:
    cam = request.get("camera")
    if cam is None:
        raise RenderError(422, "nerf renders need a camera: {c2w: 4x4} or {look_at: {eye, target, up}}")
    try:
        return camera_c2w(cam)
    except ValueError as exc:
        raise RenderError(422, f"camera: {exc}") from None


def render(job, checkpoint, request: dict[str, Any]) -> tuple[bytes, str]:
    c2w = _camera(request)
    model, hit = _model_for(checkpoint)
    width, height = int(request["width"]), int(request["height"])
    rgb, depth, alpha = _render_one(model, c2w, request, width, height)
    pixels, text = _output(rgb, depth, alpha, request.get("output", "rgb"))
    fmt = request.get("format", "png")
    text.update({"nf-model-cache": "hit" if hit else "miss", "nf-checkpoint-step": str(checkpoint.step)})
    return encode_image(pixels, fmt, text), CONTENT_TYPES[fmt]


def render_path(job, checkpoint, request: dict[str, Any]) -> tuple[bytes, str]:
    fmt = request.get("format", "webp")
    if fmt not in ("webp", "zip", "gif"):
        raise RenderError(422, f"format {fmt!r} is not available here; use webp, gif or zip")
    width, height = int(request["width"]), int(request["height"])
    if request.get("poses") is not None:
        try:
            poses = [camera_c2w(c) for c in request["poses"]]
        except ValueError as exc:
            raise RenderError(422, f"poses: {exc}") from None
    elif request.get("orbit") is not None:
        poses = orbit_poses(request["orbit"])
    else:
        raise RenderError(422, "give poses or an orbit")
    from service.settings import get_settings

    budget = PATH_PIXEL_BUDGET_FRAMES * get_settings().max_render_pixels
    if len(poses) * width * height > budget:
        raise RenderError(422, f"{len(poses)} frames of {width}x{height} is over the path budget of {budget} "
                               f"pixels ({PATH_PIXEL_BUDGET_FRAMES} x MAX_RENDER_PIXELS); use fewer or smaller frames")
    model, _ = _model_for(checkpoint)
    output = request.get("output", "rgb")
    frames = [_output(*_render_one(model, c2w, request, width, height), output)[0] for c2w in poses]
    return encode_frames(frames, fmt, int(request.get("fps", 24))), CONTENT_TYPES[fmt]


