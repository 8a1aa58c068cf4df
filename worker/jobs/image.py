"""2D image field (seed 001): Fourier features + coordinate MLP fitted to one photo.

The field maps a continuous coordinate in [-1, 1]^2 (x right, y down, pixel centres) to RGB,
so it can be sampled on any grid: renders at 4x the training size are just denser samples.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps
from torch import nn

import core.photos  # noqa: F401  (registers the HEIF reader: an uploaded photo may be HEIC)
from api_schemas.image import ImageConfig
from api_schemas.render import RenderRequest
from worker.configs import checkpoint_config, config_dict, job_config
from worker.jobs import RenderError, pick_device
from worker.scene.metrics import psnr_from_mse

RENDER_CHUNK = 1 << 16


class FourierFeatures(nn.Module):
    """L fixed frequencies 2^k·π per input dim, sin and cos; the raw input is kept in front."""

    def __init__(self, input_dim: int, num_freqs: int):
        super().__init__()
        self.input_dim = input_dim
        self.num_freqs = num_freqs
        self.register_buffer("freqs", (2.0 ** torch.arange(num_freqs)) * torch.pi)

    @property
    def out_dim(self) -> int:
        return self.input_dim + 2 * self.num_freqs * self.input_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_scaled = x.unsqueeze(-1) * self.freqs  # (..., D, L)
        feats = torch.stack([torch.sin(x_scaled), torch.cos(x_scaled)], -1)  # (..., D, L, 2)
        return torch.cat([x, feats.flatten(start_dim=-3)], dim=-1)  # (..., D + 2LD)


class CoordMLP(nn.Module):
    def __init__(
        self,
        input_dim: int = 2,
        output_dim: int = 3,
        hidden: int = 128,
        n_layers: int = 4,
        use_pe: bool = True,
        num_freqs: int = 6,
    ):
        super().__init__()
        if use_pe:
            self.encoder: nn.Module = FourierFeatures(input_dim, num_freqs)
            in_features = self.encoder.out_dim
        else:
            self.encoder = nn.Identity()
            in_features = input_dim
        layers: list[nn.Module] = [nn.Linear(in_features, hidden), nn.ReLU()]
        for _ in range(n_layers - 2):
            layers += [nn.Linear(hidden, hidden), nn.ReLU()]
        layers.append(nn.Linear(hidden, output_dim))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.mlp(self.encoder(x)))


def model_from_config(config: ImageConfig) -> CoordMLP:
    """The field an ImageConfig describes (untrained)."""
    return CoordMLP(
        hidden=config.hidden,
        n_layers=config.layers,
        use_pe=config.encoding == "fourier",
        num_freqs=config.num_frequencies,
    )


def pixel_grid(width: int, height: int, device=None) -> torch.Tensor:
    """(H*W, 2) pixel-centre coordinates in [-1, 1], row-major, (x, y) order."""
    xs = (torch.arange(width, device=device, dtype=torch.float32) + 0.5) / width * 2 - 1
    ys = (torch.arange(height, device=device, dtype=torch.float32) + 0.5) / height * 2 - 1
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([gx, gy], dim=-1).reshape(-1, 2)


def training_size(width: int, height: int, resolution: int) -> tuple[int, int]:
    scale = resolution / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def load_target(path: Path, resolution: int) -> np.ndarray:
    """The photo as float32 (H, W, 3) in [0, 1], longest side = resolution."""
    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im)  # phone photos store rotation in EXIF
        if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
            rgba = im.convert("RGBA")
            im = Image.new("RGB", rgba.size, (255, 255, 255))
            im.paste(rgba, mask=rgba.getchannel("A"))  # transparent areas train as white
        else:
            im = im.convert("RGB")
        w, h = training_size(im.width, im.height, resolution)
        im = im.resize((w, h), Image.Resampling.LANCZOS)
        return np.asarray(im, dtype=np.float32) / 255.0


def fit(
    target: np.ndarray,
    config: ImageConfig | dict[str, Any],
    device=None,
    seed: int = 0,
    on_step=None,
    start: dict[str, Any] | None = None,
) -> tuple[CoordMLP, torch.optim.Optimizer, float]:
    """Seed 001's loop: full-batch AdamW on MSE. `on_step(step, model, opt, loss)` may raise to
    stop; `start` resumes from a checkpoint. Returns model, optimizer and the final PSNR.
    A dict `config` (scripts, tests) is validated first."""
    config = ImageConfig.model_validate(config)
    device = device or torch.device("cpu")
    torch.manual_seed(seed)
    h, w, _ = target.shape
    coords = pixel_grid(w, h, device)
    y = torch.from_numpy(target).reshape(-1, 3).to(device)
    model = model_from_config(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr)
    step = 0
    if start is not None:
        model.load_state_dict(start["model"])
        opt.load_state_dict(start["opt"])
        step = start["step"]
    steps = config.steps
    while step < steps:
        pred = model(coords)
        loss = F.mse_loss(pred, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if on_step is not None:
            on_step(step, model, opt, loss)
    with torch.no_grad():
        final_mse = F.mse_loss(model(coords), y).item()
    return model, opt, psnr_from_mse(final_mse)


# -- checkpoint (de)serialisation ----------------------------------------------------------
def _pack(
    model: nn.Module, opt: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    sd = opt.state_dict()
    for idx, state in sd["state"].items():
        for key, value in state.items():
            tensors[f"opt.{idx}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    return tensors, {"opt_param_groups": sd["param_groups"]}


def _unpack(ckpt) -> dict[str, Any]:
    model_sd = {k[len("model.") :]: v for k, v in ckpt.tensors.items() if k.startswith("model.")}
    state: dict[int, dict[str, torch.Tensor]] = {}
    for k, v in ckpt.tensors.items():
        if k.startswith("opt."):
            _, idx, key = k.split(".", 2)
            state.setdefault(int(idx), {})[key] = v
    return {
        "model": model_sd,
        "opt": {"state": state, "param_groups": ckpt.meta["opt_param_groups"]},
        "step": ckpt.step,
    }


# -- kind interface ------------------------------------------------------------------------
def _dataset_image(paths) -> Path:
    found = sorted(paths.dataset.glob("image.*"))
    if not found:
        raise FileNotFoundError(f"no image in {paths.dataset}")
    return found[0]


def train(ctx) -> dict[str, Any]:
    config = ctx.config
    target = load_target(_dataset_image(ctx.paths), config.resolution)
    h, w, _ = target.shape
    steps = config.steps
    meta_base = {"config": config_dict(config), "train_width": w, "train_height": h}

    start = None
    ckpt = ctx.checkpoints.load_latest()
    if ckpt is not None and checkpoint_config(ImageConfig, ckpt) == config and ckpt.step <= steps:
        start = _unpack(ckpt)  # a redelivered task resumes where the last checkpoint left off
    ctx.progress.start_step = start["step"] if start else 0
    # Report at once: the first optimiser step can take a while (allocations, thread pools).
    ctx.progress.report(ctx.progress.start_step, steps, force=True)

    def on_step(step, model, opt, loss):
        ctx.raise_if_cancelled()
        if ctx.progress.due(step, steps):  # not every step: reading the loss waits for a GPU
            mse = loss.item()
            ctx.progress.report(step, steps, loss=mse, psnr=psnr_from_mse(mse))
        if ctx.checkpoints.due() and step < steps:
            ctx.checkpoints.save(step, *_with_meta(_pack(model, opt), meta_base))

    t0 = time.monotonic()
    model, opt, psnr = fit(target, config, device=ctx.device, on_step=on_step, start=start)
    ctx.checkpoints.save(steps, *_with_meta(_pack(model, opt), {**meta_base, "psnr": psnr}))
    ctx.paths.artifacts.mkdir(parents=True, exist_ok=True)
    (ctx.paths.artifacts / "reconstruction.png").write_bytes(
        _encode(_sample(model, w, h, ctx.device), "png")
    )
    return {
        "psnr": psnr,
        "train_width": w,
        "train_height": h,
        "train_s": round(time.monotonic() - t0, 3),
    }


def _with_meta(packed, meta_base):
    tensors, meta = packed
    return tensors, {**meta_base, **meta}


def _sample(model: nn.Module, width: int, height: int, device) -> np.ndarray:
    """The field on a width x height pixel-centre grid as uint8 (H, W, 3), in chunks to bound memory."""
    out = torch.empty((width * height, 3), dtype=torch.uint8)
    coords = pixel_grid(width, height, device)
    with torch.no_grad():
        for i in range(0, coords.shape[0], RENDER_CHUNK):
            rgb = model(coords[i : i + RENDER_CHUNK])
            out[i : i + RENDER_CHUNK] = (rgb * 255.0 + 0.5).clamp(0, 255).to(torch.uint8).cpu()
    return out.reshape(height, width, 3).numpy()


def _encode(pixels: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(
        buf, format="PNG" if fmt == "png" else "JPEG", **({"quality": 92} if fmt == "jpeg" else {})
    )
    return buf.getvalue()


def _model_for(job, checkpoint, device) -> nn.Module:
    model = checkpoint.cache.get("model")
    if model is None:
        # the checkpoint's own config: the job's may have changed since it was trained
        model = model_from_config(checkpoint_config(ImageConfig, checkpoint) or job_config(job))
        model.load_state_dict(_unpack(checkpoint)["model"])
        model = model.to(device).eval()
        checkpoint.cache["model"] = model
    return model


def render(job, checkpoint, request: RenderRequest | dict[str, Any]) -> tuple[bytes, str]:
    request = RenderRequest.model_validate(request)  # the task's typed request, or a dict
    if request.camera is not None:
        raise RenderError(422, "image jobs are 2D fields: give width and height, no camera")
    fmt = request.format
    device = pick_device()
    model = _model_for(job, checkpoint, device)
    pixels = _sample(model, request.width, request.height, device)
    return _encode(pixels, fmt), "image/png" if fmt == "png" else "image/jpeg"
