"""3DGS training: one image per step, L1 + D-SSIM, Adam with per-parameter rates, densification
(clone small / split large splats with a high view-space gradient, prune transparent and huge
ones) and periodic opacity resets, on the schedule of the 3DGS paper scaled to `steps`.

The schedule's step numbers (densify window and period, opacity resets, SH bands, the large-splat
pruning gate, the means' learning-rate decay) are those of a run that reaches `steps`; when the
time budget ends the run first, the schedule runs on the budget's clock instead: its position is
`steps` x the larger of the step fraction and the budget fraction used (`schedule_step`), so a
short budget still densifies, resets opacities and reaches every SH band.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from api_schemas.splat import ABSGRAD_THRESHOLD, GRAD_THRESHOLD, SCHEDULE_STEPS, SplatConfig
from kernels.splat_project import quat_to_rotmat
from worker.budget import time_limit
from worker.configs import config_dict
from worker.memory import reuse_freed_memory
from worker.scene.cameras import RenderCamera
from worker.scene.dataset import Dataset, background_rgb, composite_background
from worker.scene.metrics import psnr_from_mse
from worker.splat import mcmc
from worker.splat import model as gm
from worker.splat.ssim import ssim

log = logging.getLogger(__name__)
# seeds a splat job triangulated from a posed upload's photos (worker/jobs/splat.py), world frame
TRIANGULATED_POINTS = "points3D_triangulated.txt"
APPEARANCE_MEAN_WEIGHT = 1.0  # pull of the per-image transforms' mean towards the identity
# Fewest training steps between two refinements (densify/prune, MCMC relocation): when the time
# budget moves the schedule faster than the steps, gradient statistics still span several views
# and the number of Gaussians cannot double every step.
MIN_REFINE_STEPS = 10


def read_points3d(path: Path, normalization: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """COLMAP points3D.txt -> normalised positions (N, 3) and colours in [0, 1]."""
    xyz, rgb = [], []
    for line in Path(path).read_text(errors="replace").splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        xyz.append([float(v) for v in parts[1:4]])
        rgb.append([int(v) for v in parts[4:7]])
    p = torch.tensor(xyz, dtype=torch.float64) - torch.tensor(
        normalization["offset"], dtype=torch.float64
    )
    return (p * float(normalization["scale"])).float(), torch.tensor(
        rgb, dtype=torch.float32
    ) / 255.0


class TrainImages:
    """Training frames as float RGBA tensors, downscaled once to the training width if asked."""

    def __init__(self, data: Dataset, width: int | None):
        self.cams, self.rgba, self.keep = [], [], []
        for i, f in enumerate(data.frames):
            img, keep = data.frame_rgba(i), data.frame_mask(i)
            s = 1.0 if not width or width >= f.w else width / f.w
            w, h = max(1, round(f.w * s)), max(1, round(f.h * s))
            if (w, h) != (f.w, f.h):
                img = F.interpolate(img.permute(2, 0, 1)[None], size=(h, w), mode="area")[
                    0
                ].permute(1, 2, 0)
                if keep is not None:
                    keep = F.interpolate(keep[None, None].float(), size=(h, w))[0, 0] > 0.5
            sx, sy = w / f.w, h / f.h
            self.cams.append(
                RenderCamera(
                    torch.tensor(f.c2w, dtype=torch.float32),
                    f.fx * sx,
                    f.fy * sy,
                    f.cx * sx,
                    f.cy * sy,
                    w,
                    h,
                )
            )
            self.rgba.append(img.contiguous())
            self.keep.append(keep)

    def __len__(self):
        return len(self.cams)


def scene_extent(cams: list[RenderCamera]) -> float:
    """3DGS's radius: 1.1 x the largest camera distance from the cameras' mean centre."""
    c = torch.stack([cam.c2w[:3, 3] for cam in cams])
    return float(1.1 * (c - c.mean(0)).norm(dim=-1).max().clamp(min=1e-3))


class SplatTrainer:
    def __init__(
        self,
        config: SplatConfig | dict[str, Any],
        meta: dict[str, Any],
        device,
        data: Dataset,
        dataset_dir: Path | None = None,
    ):
        # The job hands its validated config on; a dict (scripts, tests) is validated here.
        config = SplatConfig.model_validate(config)
        reuse_freed_memory()  # every step frees and allocates the same buffers again
        self.config, self.meta, self.device = config, meta, device
        self.gen = torch.Generator().manual_seed(int(config.seed))
        self.images = TrainImages(data, config.train_resolution)
        self.has_alpha = data.has_alpha
        self.extent = scene_extent(self.images.cams)
        self.eval_background = torch.tensor(background_rgb(config.background), device=device)
        self.step = 0
        self.train_s = 0.0
        self.degree = int(config.sh_degree)
        self.antialiased = config.antialiased
        self.mcmc = config.strategy == "mcmc"
        self.binoms = mcmc.binomial_table() if self.mcmc else None
        self.params = {k: v.to(device) for k, v in self._init(dataset_dir).items()}
        self._make_optimizer()
        # Per-image affine colour transforms (training only), rows [M | b]: rgb' = M rgb + b
        self.appearance = None
        if config.appearance:
            eye = torch.eye(3, 4, device=device)
            self.appearance = torch.nn.Parameter(eye.repeat(len(self.images), 1, 1))
            self.app_opt = torch.optim.Adam([self.appearance], lr=config.lr_appearance)
        self._reset_stats()
        self.densify_until = config.densify_until * schedule_length(config)
        # Seconds of the job's budget at which training ends (set by the job, as for nerf)
        self.lr_horizon_s: float | None = None
        self.budget_used_s = 0.0
        self.sched = 0.0  # schedule position after the last step (see schedule_step)
        self.counts = {"densifications": 0, "opacity_resets": 0, "relocated": 0}
        self.last_refine_step = -MIN_REFINE_STEPS

    # -- state --------------------------------------------------------------------------------
    def _init(self, dataset_dir: Path | None):
        cfg = self.config
        pts_file = None
        if dataset_dir is not None:  # seeds triangulated for this job before the upload's points
            tri = Path(dataset_dir) / TRIANGULATED_POINTS
            pts_file = tri if tri.is_file() else Path(dataset_dir) / "points3D.txt"
        use_points = cfg.init == "points3d" or (
            cfg.init == "auto" and pts_file is not None and pts_file.is_file()
        )
        if use_points:
            pts, cols = read_points3d(pts_file, self.meta["normalization"])
            log.info("splat init: %d points from %s", pts.shape[0], pts_file.name)
        else:
            lo, hi = (torch.tensor(v, dtype=torch.float32) for v in self.meta["aabb"])
            mid, half = (lo + hi) / 2, (hi - lo) / 2 * float(cfg.init_extent)
            n = int(cfg.n_init_points)
            pts = mid + (torch.rand(n, 3, generator=self.gen) * 2 - 1) * half
            cols = torch.rand(n, 3, generator=self.gen)
        if not self.mcmc:
            return gm.init_tensors(pts, cols, self.degree)
        cap = int(cfg.cap_max)
        if pts.shape[0] > cap:  # the cap holds from the start
            pick = torch.randperm(pts.shape[0], generator=self.gen)[:cap]
            pts, cols = pts[pick], cols[pick]
        # gsplat's MCMC start: opacity 0.5, a tenth of the neighbour distance
        t = gm.init_tensors(pts, cols, self.degree, opacity=0.5)
        t["scales"] = t["scales"] + math.log(0.1)
        return t

    def _lrs(self) -> dict[str, float]:
        c = self.config
        return {
            "means": c.lr_means * self.extent,
            "scales": c.lr_scales,
            "quats": c.lr_quats,
            "opacities": c.lr_opacity,
            "sh_dc": c.lr_sh_dc,
            "sh_rest": c.lr_sh_rest,
        }

    def _make_optimizer(self, moments: dict[str, torch.Tensor] | None = None):
        for k in gm.NAMES:
            self.params[k] = torch.nn.Parameter(self.params[k].detach().contiguous())
        lrs = self._lrs()
        self.opt = torch.optim.Adam(
            [{"params": [self.params[k]], "lr": lrs[k], "name": k} for k in gm.NAMES], eps=1e-15
        )
        if moments:
            for k in gm.NAMES:
                if f"m1_{k}" not in moments:
                    continue
                p = self.params[k]
                self.opt.state[p] = {
                    "step": moments["adam_step"].clone().float(),
                    "exp_avg": moments[f"m1_{k}"].to(self.device),
                    "exp_avg_sq": moments[f"m2_{k}"].to(self.device),
                }

    def _reset_stats(self):
        n = self.params["means"].shape[0]
        self.grad_accum = torch.zeros(n, device=self.device)
        self.grad_count = torch.zeros(n, device=self.device)
        self.max_radii = torch.zeros(n, device=self.device)

    @property
    def n(self) -> int:
        return int(self.params["means"].shape[0])

    def schedule_step(self) -> float:
        """Where the run stands on the `steps`-long schedule: the step, or further when the time
        budget is used up faster than the steps (the job's real horizon)."""
        steps = schedule_length(self.config)
        frac = self.step / steps
        if self.lr_horizon_s:
            frac = max(frac, self.budget_used_s / self.lr_horizon_s)
        elif not self.config.steps:  # no job around it (scripts): the device's default budget
            frac = self.train_s / time_limit(self.config.time_limit_s, self.device)
        return min(frac, 1.0) * steps

    def active_degree(self) -> int:
        return min(self.degree, int(self.sched // int(self.config.sh_increase_every)))

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        t = {k: v.detach().cpu().contiguous() for k, v in self.params.items()}
        adam_step = 0.0
        for k in gm.NAMES:
            st = self.opt.state.get(self.params[k], {})
            if "exp_avg" in st:
                t[f"m1_{k}"] = st["exp_avg"].detach().cpu().contiguous()
                t[f"m2_{k}"] = st["exp_avg_sq"].detach().cpu().contiguous()
                adam_step = float(st["step"])
        t["adam_step"] = torch.tensor(adam_step)
        if self.appearance is not None:
            t["appearance"] = self.appearance.detach().cpu().contiguous()
        meta = {
            "kind": "splat",
            "config": config_dict(self.config),
            "step": self.step,
            "train_s": self.train_s,
            "budget_used_s": getattr(self, "budget_used_s", 0.0),
            "n_gaussians": self.n,
            "schedule_step": self.sched,
            "counts": self.counts,
            "sh_degree": self.degree,
            "antialiased": self.antialiased,  # renderers and exported files follow it
            "active_degree": self.active_degree(),
            "normalization": self.meta["normalization"],
            "world_up": self.meta.get("world_up"),
            "extent": self.extent,
            "camera": _default_camera(self.meta),
        }
        return t, meta

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        self.params = {k: tensors[k].to(self.device) for k in gm.NAMES}
        if self.appearance is not None and "appearance" in tensors:
            self.appearance = torch.nn.Parameter(tensors["appearance"].to(self.device))
            self.app_opt = torch.optim.Adam([self.appearance], lr=self.config.lr_appearance)
        moments = tensors if "m1_means" in tensors else None
        self._make_optimizer(moments)
        self._reset_stats()
        self.step = int(meta["step"])
        self.train_s = float(meta.get("train_s", 0.0))
        self.budget_used_s = float(meta.get("budget_used_s", 0.0))  # the job's wall-time budget
        self.sched = float(meta.get("schedule_step", self.step))
        self.counts = {**self.counts, **meta.get("counts", {})}

    # -- one step -----------------------------------------------------------------------------
    def _background(self) -> torch.Tensor:
        mode = self.config.train_background
        if mode == "random" and self.has_alpha:
            return torch.rand(3, generator=self.gen).to(self.device)
        if mode == "black":
            return torch.zeros(3, device=self.device)
        return self.eval_background if mode == "random" else torch.ones(3, device=self.device)

    def _set_lr(self):
        c = self.config
        t = self.schedule_step() / schedule_length(c)
        lr = math.exp((1 - t) * math.log(c.lr_means) + t * math.log(c.lr_means_final)) * self.extent
        for g in self.opt.param_groups:
            if g["name"] == "means":
                g["lr"] = lr

    def train_step(self) -> dict[str, float]:
        t0 = time.perf_counter()
        c = self.config
        self._set_lr()
        i = int(torch.randint(0, len(self.images), (1,), generator=self.gen))
        cam = self.images.cams[i]
        bg = self._background()
        target = composite_background(self.images.rgba[i].to(self.device), bg)
        out = gm.render(self.params, cam, bg, self.active_degree(), c.method, self.antialiased)
        rgb = out.rgb
        if self.appearance is not None:  # this photo's exposure / white balance
            a = self.appearance[i]
            rgb = rgb @ a[:, :3].T + a[:, 3]
        keep = self.images.keep[i]
        if keep is not None:  # masked pixels take the render's own colour: no gradient from them
            target = torch.where(keep.to(self.device)[..., None], target, rgb.detach())
        l1 = (rgb - target).abs().mean()
        loss = (1 - c.lambda_dssim) * l1 + c.lambda_dssim * (1 - ssim(rgb, target))
        if self.appearance is not None:
            # The transforms' mean stays the identity: the Gaussians keep the colours of an
            # average photo, which is what renders without a transform (held-out views) show.
            eye = torch.eye(3, 4, device=self.device)
            loss = loss + APPEARANCE_MEAN_WEIGHT * ((self.appearance.mean(0) - eye) ** 2).sum()
        if self.mcmc:  # the paper's L1 priors: unneeded Gaussians fade out and shrink
            loss = loss + c.mcmc_opacity_reg * torch.sigmoid(self.params["opacities"]).mean()
            loss = loss + c.mcmc_scale_reg * torch.exp(self.params["scales"]).mean()
        self.opt.zero_grad(set_to_none=True)
        if self.appearance is not None:
            self.app_opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.appearance is not None:
            self.app_opt.step()
        with torch.no_grad():
            mse = ((rgb - target) ** 2).mean()
            if (
                not self.mcmc
                and self.sched < self.densify_until
                and out.means2d.grad is not None
                and out.visible.numel()
            ):
                # view-space gradient in NDC units as 3DGS measures it (pixels span 2 / size)
                g = self._absgrad(out.means2d) if c.absgrad else out.means2d.grad
                g = g * torch.tensor([cam.width / 2, cam.height / 2], device=self.device)
                norm, ones, radii = g.norm(dim=-1), torch.ones_like(out.radii), out.radii
                if out.shown is not None:  # every splat rendered, those out of view masked
                    w = out.shown.to(out.radii.dtype)
                    norm, ones, radii = norm * w, w, radii * w
                self.grad_accum.index_add_(0, out.visible, norm)
                self.grad_count.index_add_(0, out.visible, ones)
                self.max_radii[out.visible] = torch.maximum(
                    self.max_radii[out.visible], radii / max(cam.width, cam.height)
                )
        self.opt.step()
        self.step += 1
        prev, self.sched = self.sched, self.schedule_step()
        if self.mcmc:
            self._mcmc_step(prev)
        elif self.sched < self.densify_until:

            def crossed(every: int) -> bool:  # a multiple of `every` passed during this step
                return int(self.sched // every) > int(prev // every)

            if self.sched >= c.densify_from and crossed(c.densify_every) and self._may_refine():
                self.densify_and_prune()
                self.counts["densifications"] += 1
            if crossed(c.opacity_reset_every):
                self.reset_opacity()
                self.counts["opacity_resets"] += 1
        # Loss and MSE read back together: one wait for the device a step, not two.
        loss_value, mse = torch.stack([loss.detach(), mse]).tolist()
        self.train_s += time.perf_counter() - t0
        return {
            "loss": loss_value,
            "psnr": psnr_from_mse(mse),
            "n_gaussians": self.n,
            "seconds": time.perf_counter() - t0,
        }

    def _may_refine(self) -> bool:
        if self.step - self.last_refine_step < MIN_REFINE_STEPS:
            return False
        self.last_refine_step = self.step
        return True

    # -- MCMC -----------------------------------------------------------------------------------
    def _mcmc_step(self, prev: float):
        c = self.config
        every = int(c.densify_every)
        crossed = int(self.sched // every) > int(prev // every)
        if c.densify_from <= self.sched < self.densify_until and crossed and self._may_refine():
            self.counts["relocated"] += self.relocate_dead()
            self.add_gaussians()
            self.counts["densifications"] += 1
        lr = next(g["lr"] for g in self.opt.param_groups if g["name"] == "means")
        p = self.params
        with torch.no_grad():
            p["means"].add_(
                mcmc.position_noise(
                    p["means"],
                    p["scales"],
                    p["quats"],
                    p["opacities"],
                    lr * c.mcmc_noise_lr,
                    self.gen,
                )
            )

    def _sampled(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rows of `idx` with the relocation's opacity and scale (each source split len-fold
        among itself and its copies), written back to the sources; returns the copies' rows."""
        c = self.config
        p = {k: v.detach() for k, v in self.params.items()}
        op = torch.sigmoid(p["opacities"][idx])
        copies = torch.bincount(idx, minlength=self.n)[idx] + 1
        new_o, new_s = mcmc.relocated(op, torch.exp(p["scales"][idx]), copies, self.binoms)
        new_o = new_o.clamp(min=c.prune_opacity, max=1 - torch.finfo(torch.float32).eps)
        p["opacities"][idx] = gm.inverse_sigmoid(new_o)
        p["scales"][idx] = torch.log(new_s)
        for g in self.opt.param_groups:  # the sources restart their moments
            st = self.opt.state.get(g["params"][0], {})
            for name in ("exp_avg", "exp_avg_sq"):
                if name in st:
                    st[name][idx] = 0
        return {k: p[k][idx].clone() for k in gm.NAMES}

    def relocate_dead(self) -> int:
        """Dead Gaussians (opacity <= prune_opacity) take the place of copies of live ones."""
        with torch.no_grad():
            op = torch.sigmoid(self.params["opacities"].detach())
            dead = (op <= self.config.prune_opacity).nonzero().squeeze(1)
            alive = (op > self.config.prune_opacity).nonzero().squeeze(1)
            if not dead.numel() or not alive.numel():
                return 0
            src = alive[mcmc.sample_sources(op[alive], dead.numel(), self.gen)]
            rows = self._sampled(src)
            for g in self.opt.param_groups:
                k = g["name"]
                self.params[k].data[dead] = rows[k]
                st = self.opt.state.get(g["params"][0], {})
                for name in ("exp_avg", "exp_avg_sq"):
                    if name in st:
                        st[name][dead] = 0
        return int(dead.numel())

    def add_gaussians(self) -> int:
        """5 % more Gaussians (up to cap_max), copies of ones drawn by opacity."""
        n_new = max(0, min(int(self.config.cap_max), int(1.05 * self.n)) - self.n)
        if not n_new:
            return 0
        with torch.no_grad():
            op = torch.sigmoid(self.params["opacities"].detach())
            rows = self._sampled(mcmc.sample_sources(op, n_new, self.gen))
        self._edit(None, rows)
        return n_new

    # -- densification ------------------------------------------------------------------------
    def _edit(self, keep: torch.Tensor | None, extra: dict[str, torch.Tensor] | None):
        """Keep rows `keep` (int64 indices) and append `extra`, carrying Adam moments along
        (zeros for new rows)."""
        for g in self.opt.param_groups:
            k = g["name"]
            old = g["params"][0]
            st = self.opt.state.pop(old, None)
            val = old.detach() if keep is None else old.detach().index_select(0, keep)
            if extra is not None:
                val = torch.cat([val, extra[k]])
            new = torch.nn.Parameter(val.contiguous())
            if st is not None:
                for name in ("exp_avg", "exp_avg_sq"):
                    m = st[name] if keep is None else st[name].index_select(0, keep)
                    if extra is not None:
                        m = torch.cat([m, torch.zeros_like(extra[k])])
                    st[name] = m.contiguous()
                self.opt.state[new] = st
            g["params"][0] = new
            self.params[k] = new

    @property
    def grad_threshold(self) -> float:
        c = self.config
        if c.densify_grad_threshold is not None:
            return float(c.densify_grad_threshold)
        return ABSGRAD_THRESHOLD if c.absgrad else GRAD_THRESHOLD

    @staticmethod
    def _absgrad(means2d: torch.Tensor) -> torch.Tensor:
        absgrad = getattr(means2d, "absgrad", None)
        if absgrad is None:  # the pure-torch reference compositor computes none
            raise ValueError("absgrad needs a compiled rasterizer (tiled or naive)")
        return absgrad

    def densify_and_prune(self):
        c = self.config
        with torch.no_grad():
            grads = self.grad_accum / self.grad_count.clamp(min=1)
            big = grads >= self.grad_threshold
            max_scale = torch.exp(self.params["scales"]).max(-1).values
            small = max_scale <= c.percent_dense * self.extent
            room = max(0, int(c.max_gaussians) - self.n)
            clone = (big & small).nonzero().squeeze(1)[:room]
            room -= clone.numel()
            split = (big & ~small).nonzero().squeeze(1)[:room]
            p = {k: v.detach() for k, v in self.params.items()}
            extra = {k: p[k][clone] for k in gm.NAMES}
            # split: two samples from each large Gaussian, 1.6x smaller
            if split.numel():
                scales = torch.exp(p["scales"][split]).repeat(2, 1)
                rot = quat_to_rotmat(p["quats"][split]).repeat(2, 1, 1)
                offs = (rot @ (torch.randn(scales.shape, device=self.device) * scales)[..., None])[
                    ..., 0
                ]
                new = {k: p[k][split].repeat(2, *([1] * (p[k].dim() - 1))) for k in gm.NAMES}
                new["means"] = new["means"] + offs
                new["scales"] = torch.log(scales / 1.6)
                extra = {k: torch.cat([extra[k], new[k]]) for k in gm.NAMES}
            # Rows as indices, each mask read once: on a GPU every mask indexing waits for the
            # device, and _edit indexes three tensors a parameter.
            n_old = self.n
            keep = torch.ones(n_old, dtype=torch.bool, device=self.device)
            keep[split] = False
            keep = keep.nonzero().squeeze(1)
            self._edit(keep, extra)
            self.max_radii = torch.cat(
                [
                    self.max_radii.index_select(0, keep),
                    torch.zeros(self.n - keep.numel(), device=self.device),
                ]
            )
            # prune
            op = torch.sigmoid(self.params["opacities"].detach())
            prune = op < c.prune_opacity
            if self.sched > c.opacity_reset_every:
                prune |= self.max_radii > c.prune_screen_size
                prune |= (
                    torch.exp(self.params["scales"].detach()).max(-1).values
                    > c.prune_world_size * self.extent
                )
            keep = (~prune).nonzero().squeeze(1)
            if not keep.numel():  # never all of them
                keep = torch.zeros(1, dtype=torch.int64, device=self.device)
            self._edit(keep, None)
        self._reset_stats()

    def reset_opacity(self):
        with torch.no_grad():
            capped = torch.minimum(
                self.params["opacities"].detach(),
                gm.inverse_sigmoid(torch.tensor(0.01)).to(self.device),
            )
        for g in self.opt.param_groups:
            if g["name"] == "opacities":
                old = g["params"][0]
                st = self.opt.state.pop(old, None)
                new = torch.nn.Parameter(capped.contiguous())
                if st is not None:
                    st["exp_avg"].zero_()
                    st["exp_avg_sq"].zero_()
                    self.opt.state[new] = st
                g["params"][0] = new
                self.params["opacities"] = new


def _default_camera(meta: dict[str, Any]) -> dict[str, Any]:
    """The first training camera's intrinsics: renders without any keep its field of view."""
    f = next((f for f in meta["frames"] if f.get("split", "train") == "train"), meta["frames"][0])
    return {"fx": f["fx"], "fy": f["fy"], "w": f["w"], "h": f["h"]}


def to_numpy(img: torch.Tensor) -> np.ndarray:
    return img.detach().clamp(0, 1).cpu().numpy()


def schedule_length(config: SplatConfig) -> int:
    """The schedule's length in steps: the job's `steps`, or SCHEDULE_STEPS for a job that trains
    until its budget (which then trains on at the schedule's end once it has run its course)."""
    return int(config.steps or SCHEDULE_STEPS)
