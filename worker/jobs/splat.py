"""kind=splat: posed photos -> 3D Gaussians -> frames for any camera, and a PLY export.

Same dataset normal form, camera conventions, render requests, progress and checkpoints as
kind=nerf (worker/jobs/nerf.py): request poses are in the dataset's world frame and normalised
here; the Gaussians built from a checkpoint stay in `checkpoint.cache`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from worker.cameras import path_cameras, resolve_request_camera, world_distance
from worker.jobs import RenderError, pick_device

# kind=nerf's request clean-up and output encodings, shared so both kinds answer alike
from worker.jobs.scene_render import PATH_PIXEL_BUDGET_FRAMES, clean_camera, output_pixels
from worker.nerf.data import Dataset, background_rgb, composite_background, read_meta
from worker.nerf.encode import CONTENT_TYPES, encode_frames, encode_image, to_uint8
from worker.nerf.evaluate import psnr_np, ssim_np
from worker.splat import model as gm
from worker.splat.ply import ply_bytes
from worker.splat.trainer import SplatTrainer, to_numpy

log = logging.getLogger(__name__)
PLY_NAME = "point_cloud.ply"


# -- training --------------------------------------------------------------------------------
def _resume(ctx, trainer: SplatTrainer) -> None:
    ckpt = ctx.checkpoints.load_latest()
    if ckpt is None:
        return
    if ckpt.meta.get("kind") != "splat" or ckpt.meta.get("config") != ctx.config:
        log.warning(
            "job %s: checkpoint step %s does not match this config; starting over",
            ctx.job.id,
            ckpt.step,
        )
        return
    trainer.load_state(ckpt.tensors, ckpt.meta)
    log.info(
        "job %s: resumed from checkpoint step %s (%d Gaussians)",
        ctx.job.id,
        trainer.step,
        trainer.n,
    )


def evaluate(trainer: SplatTrainer, test: Dataset, keep: int = 0):
    psnrs, ssims, kept = [], [], []
    bg = trainer.eval_background
    with torch.no_grad():
        for i, f in enumerate(test.frames):
            cam = gm.Camera(
                torch.tensor(f.c2w, dtype=torch.float32), f.fx, f.fy, f.cx, f.cy, f.w, f.h
            )
            pred = to_numpy(gm.render(trainer.params, cam, bg, trainer.degree, "tiled").rgb)
            gt = composite_background(test.frame_rgba(i), bg.cpu()).numpy()
            psnrs.append(psnr_np(pred, gt))
            ssims.append(ssim_np(pred, gt))
            if i < keep:
                kept.append((i, pred))
    return {
        "test_psnr": float(np.mean(psnrs)),
        "test_ssim": float(np.mean(ssims)),
        "n_test": len(test),
    }, kept


def train(ctx) -> dict[str, Any]:
    config = ctx.config
    meta = read_meta(ctx.paths.dataset)
    trainer = SplatTrainer(
        config, meta, ctx.device, Dataset(ctx.paths.dataset, "train", meta), ctx.paths.dataset
    )
    _resume(ctx, trainer)
    steps, limit = config["steps"], config.get("time_limit_s")
    ctx.progress.start_step = trainer.step
    ctx.progress.report(trainer.step, steps, force=True)
    last: dict[str, float] = {}
    while trainer.step < steps and not (limit and trainer.train_s >= limit):
        ctx.raise_if_cancelled()
        last = trainer.train_step()
        ctx.progress.report(trainer.step, steps, loss=last["loss"], psnr=last["psnr"])
        if trainer.step < steps and (
            trainer.step % config["checkpoint_every"] == 0 or ctx.checkpoints.due()
        ):
            ctx.checkpoints.save(trainer.step, *trainer.state())
    ctx.checkpoints.save(trainer.step, *trainer.state())
    ctx.progress.report(
        trainer.step, steps, loss=last.get("loss"), psnr=last.get("psnr"), force=True
    )

    ctx.raise_if_cancelled()
    t0 = time.perf_counter()
    test = Dataset(ctx.paths.dataset, "test", meta)
    metrics, renders = evaluate(trainer, test, keep=config["n_test_renders"])
    ctx.paths.artifacts.mkdir(parents=True, exist_ok=True)
    names = []
    for i, img in renders:
        name = f"test_{i:03d}.png"
        (ctx.paths.artifacts / name).write_bytes(
            encode_image(to_uint8(img), "png", {"source": test.frames[i].file})
        )
        names.append(name)
    # world units, so that viewers show the scene as uploaded
    (ctx.paths.artifacts / PLY_NAME).write_bytes(ply_bytes(trainer.params, meta["normalization"]))
    names.append(PLY_NAME)
    metrics.update(
        {
            "steps": trainer.step,
            "train_s": round(trainer.train_s, 3),
            "eval_s": round(time.perf_counter() - t0, 3),
            "train_psnr": last.get("psnr"),
            "n_gaussians": trainer.n,
            "artifacts": names,
        }
    )
    return metrics


# -- rendering -------------------------------------------------------------------------------
class _Model:
    def __init__(self, checkpoint, device):
        meta = checkpoint.meta
        self.config = meta["config"]
        self.params = {k: checkpoint.tensors[k].to(device) for k in gm.NAMES}
        self.degree = int(meta["sh_degree"])
        self.normalization = meta["normalization"]
        cam = meta["camera"]
        # what worker.cameras needs to resolve request cameras (as kind=nerf)
        self.camera_meta = {
            "normalization": self.normalization,
            "world_up": meta.get("world_up"),
            "frames": [{"fx": cam["fx"], "w": cam["w"], "split": "train"}],
        }
        self.device = device


def _model_for(checkpoint) -> tuple[_Model, bool]:
    model = checkpoint.cache.get("splat")
    if model is not None:
        return model, True
    if checkpoint.meta.get("kind") != "splat":
        raise RenderError(409, "the job's checkpoint is not a splat checkpoint")
    model = _Model(checkpoint, pick_device())
    checkpoint.cache["splat"] = model
    return model, False


def _render_one(model: _Model, rc, request: dict[str, Any]):
    """rgb (H, W, 3), depth (H, W) in world units (0 where empty), alpha (H, W) for a worker.cameras.RenderCamera."""
    cam = gm.Camera(rc.c2w.to(torch.float32), rc.fx, rc.fy, rc.cx, rc.cy, rc.width, rc.height)
    spec = request.get("background")
    bg = torch.tensor(
        background_rgb(spec if spec is not None else model.config.get("background")),
        device=model.device,
    )
    with torch.no_grad():
        out = gm.render(model.params, cam, bg, model.degree, "tiled")
        depth = (
            gm.render_depth(model.params, cam, out)
            if request.get("output") == "depth"
            else torch.zeros(rc.height, rc.width)
        )
    return (
        to_numpy(out.rgb),
        world_distance(depth, model.normalization).cpu().numpy(),
        out.alpha.cpu().numpy(),
    )


def render(job, checkpoint, request: dict[str, Any]) -> tuple[bytes, str]:
    request = {**request, "camera": clean_camera(request.get("camera"), "camera")}
    model, hit = _model_for(checkpoint)
    rc = resolve_request_camera(request, model.camera_meta)
    pixels, text = output_pixels(*_render_one(model, rc, request), request.get("output", "rgb"))
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
    model, _ = _model_for(checkpoint)
    output = request.get("output", "rgb")
    frames = [
        output_pixels(*_render_one(model, rc, request), output)[0]
        for rc in path_cameras(request, model.camera_meta)
    ]
    return encode_frames(frames, fmt, int(request.get("fps", 24))), CONTENT_TYPES[fmt]
