"""One NeRF optimisation run: field + occupancy grid + Adam, with state that round-trips through
a checkpoint (tensors + JSON meta) so a redelivered task continues where it stopped."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch
import torch.nn.functional as F

from api_schemas.nerf import (
    DEFAULT_CONE_ANGLE,
    DEFAULT_SAMPLES_PER_STEP,
    SCENE_DISTORTION_LOSS,
    SCENE_GRADIENT_DISTANCE,
    SCENE_MIN_VIEWS,
    SCENE_NEAR_DISTANCE,
    NerfConfig,
)
from kernels import HashGridAdam, OccupancyGrid
from worker.budget import device_type, time_limit
from worker.configs import config_dict
from worker.memory import reuse_freed_memory
from worker.nerf.error_map import ErrorMap
from worker.nerf.losses import distortion, render_weights
from worker.nerf.model import NerfField
from worker.nerf.rendering import RenderStats, render_rays
from worker.scene.dataset import Dataset, background_rgb, composite_background
from worker.scene.metrics import psnr_from_mse as psnr

log = logging.getLogger(__name__)
APPEARANCE_MEAN_WEIGHT = 1.0  # pull of the per-image transforms' mean towards the identity

MIN_RAYS = 64
# Bumped when the checkpoint's tensors change meaning; an older checkpoint is not resumed (it
# still renders: the meta says its box and grid). 3: occupancy cascades over boxes past the unit cube.
STATE_FORMAT = 3
# The default hash table size's range (table_log2): instant-ngp's 2^19 is the most.
TABLE_LOG2_MIN, TABLE_LOG2_MAX = 14, 19


def cone_angle(config: NerfConfig, half: float, device=None) -> float:
    """The config's cone angle, or the default: constant steps in the unit box; in a larger box
    (large, unbounded captures) steps growing with distance, by DEFAULT_CONE_ANGLE of the
    device's type (instant-ngp's 1/256 without a device: what checkpoints whose meta has no
    cone angle were trained with)."""
    if config.cone_angle is not None:
        return float(config.cone_angle)
    if half <= 1.0:
        return 0.0
    return DEFAULT_CONE_ANGLE[device_type(device)] if device is not None else 1.0 / 256.0


def scene_defaults(config: NerfConfig, half: float) -> dict[str, float | int]:
    """The distortion loss and near distance of the config, or the defaults for its scene box:
    SCENE_* past the unit cube (a capture with a background), 0 for an object in its box."""
    scene = half > 1.0
    return {
        "distortion_loss": config.distortion_loss
        if config.distortion_loss is not None
        else (SCENE_DISTORTION_LOSS if scene else 0.0),
        "near_distance": config.near_distance
        if config.near_distance is not None
        else (SCENE_NEAR_DISTANCE if scene else 0.0),
        "near_gradient_distance": config.near_gradient_distance
        if config.near_gradient_distance is not None
        else (SCENE_GRADIENT_DISTANCE if scene else 0.0),
        "occupancy_min_views": config.occupancy_min_views
        if config.occupancy_min_views is not None
        else (SCENE_MIN_VIEWS if scene else 1),
    }


def table_log2(config: NerfConfig, meta: dict[str, Any]) -> int:
    """The config's hash table size, or one scaled to the training pixels P: floor(log2 P) - 2
    within 14..19. A table far larger than the photos constrain costs memory traffic every step
    and learns nothing more: on the quality-bar scene (6e5 pixels) 2^17 rows per level trained
    1500 steps 16 % faster than 2^19 and ended 0.12 dB higher (docs/nerf.md)."""
    if config.log2_hashmap_size is not None:
        return int(config.log2_hashmap_size)
    frames = [f for f in meta.get("frames", []) if f.get("split", "train") == "train"]
    pixels = sum(int(f["w"]) * int(f["h"]) for f in frames)
    if pixels <= 0:
        return TABLE_LOG2_MAX
    return min(max(pixels.bit_length() - 1 - 2, TABLE_LOG2_MIN), TABLE_LOG2_MAX)


def samples_per_step(config: NerfConfig, device) -> int:
    """The config's samples per step, or the default for the worker's device."""
    if config.samples_per_step:
        return int(config.samples_per_step)
    return DEFAULT_SAMPLES_PER_STEP[device_type(device)]


def aabb_half(meta: dict[str, Any], config: NerfConfig) -> float:
    """The scene box's half size: the config's aabb_scale, else the dataset's box."""
    if config.aabb_scale:
        return float(config.aabb_scale)
    return float(meta.get("aabb", [[-1.0] * 3, [1.0] * 3])[1][0])


def grid_layout(half: float) -> tuple[float, int]:
    """(half size of cascade 0, number of cascades) of the occupancy grid over [-half, half]^3.

    A box larger than the unit cube gets instant-ngp's cascades: cascade 0 is (about) the unit
    box, each next one twice as large, ceil(log2 half) + 1 of them, the last exactly the scene
    box; so the subject keeps the unit box's cell size while the room or landscape around it is
    covered by coarser cells. One cascade over a 4x box gave the subject 4x coarser cells."""
    if half <= 1.0:
        return half, 1
    n = math.ceil(math.log2(half) - 1e-9) + 1
    return half / 2.0 ** (n - 1), n


def occupancy_resolution(config: NerfConfig, n_cascades: int, device: torch.device) -> int:
    """The config's cells per cascade side, or 128 (instant-ngp's), halved on a CPU when there
    are cascades: each update evaluates the field at a quarter to all of every cascade's cells,
    and three cascades of 128^3 made the updates a quarter of a CPU step (docs/nerf.md)."""
    if config.occupancy_resolution is not None:
        return int(config.occupancy_resolution)
    return 64 if n_cascades > 1 and device.type == "cpu" else 128


def max_march_step(half: float, resolution: int, n_cascades: int) -> float:
    """Largest march step with a cone angle: the diagonal of a cell of the outermost cascade
    (instant-ngp's MAX_CONE_STEPSIZE), so steps that grow with distance never jump a cell of the
    cascade they are in; unbounded (steps are the cone's) with one cascade, as before."""
    if n_cascades <= 1:
        return 1e10
    return math.sqrt(3) * 2.0 * half / resolution


class NerfTrainer:
    """`step()` runs one batch; `state()` / `load_state()` pack everything needed to resume."""

    state_format = STATE_FORMAT

    def __init__(
        self,
        config: NerfConfig | dict[str, Any],
        meta: dict[str, Any],
        device=None,
        data: Dataset | None = None,
    ):
        # The job hands its validated config on; a dict (scripts, tests) is validated here.
        config = NerfConfig.model_validate(config)
        reuse_freed_memory()  # every step frees and allocates the same buffers again
        self.requested_config = config  # what the job asked for (checkpoints compare it)
        self.meta = meta
        self.device = torch.device(device or "cpu")
        self.data = data
        self.half = aabb_half(meta, config)
        grid_half, n_cascades = grid_layout(self.half)
        # Defaults that depend on the scene, resolved once.
        self.config = config.model_copy(
            update={
                "cone_angle": cone_angle(config, self.half, self.device),
                "log2_hashmap_size": table_log2(config, meta),
                "samples_per_step": samples_per_step(config, self.device),
                "occupancy_resolution": occupancy_resolution(config, n_cascades, self.device),
                **scene_defaults(config, self.half),
            }
        )
        # Seconds of the run the learning rate decays over (set by the job from its time budget)
        # and how many of them were used; without one the schedule follows the planned steps.
        self.lr_horizon_s: float | None = None
        self.budget_used_s = 0.0
        self.backend = config.backend
        # Same lattice for training and rendering: the diagonal of cascade 0 (the whole box with
        # one cascade) / max_samples_per_ray; with cascades the cone angle lengthens steps with
        # distance, up to `max_step`.
        self.step_size = 2 * math.sqrt(3) * grid_half / config.max_samples_per_ray
        self.max_step = max_march_step(self.half, self.config.occupancy_resolution, n_cascades)
        torch.manual_seed(config.seed)
        self.field = NerfField(self.config, self.half, self.backend).to(self.device)
        # Grid densities are optical thickness per render step, so the threshold means
        # "at least this alpha over one step" whatever the step size.
        self.grid = OccupancyGrid(
            [-grid_half] * 3 + [grid_half] * 3,
            resolution=self.config.occupancy_resolution,
            n_cascades=n_cascades,
            step_size=self.step_size,
            backend=self.backend,
        ).to(self.device)
        if data is not None:
            self._mark_unseen(data)
        self.opt = torch.optim.Adam(
            self.field.mlp_param_groups(config.weight_decay),
            lr=config.lr,
            betas=tuple(config.adam_betas),
            eps=config.adam_eps,
            fused=True,
        )
        # The table: only the rows a batch touched are updated (instant-ngp's Adam), no weight
        # decay (decaying entries would erase rarely seen detail).
        self.table_opt = HashGridAdam(
            self.field.encoding, config.lr, tuple(config.adam_betas), config.adam_eps
        )
        # Per-image affine colour transforms (training only), rows [M | b]: rgb' = M rgb + b. A
        # phone's auto exposure and white balance then need no floaters in front of one photo.
        self.appearance: torch.nn.Parameter | None = None
        if data is not None and (
            config.appearance if config.appearance is not None else not data.has_alpha
        ):
            eye = torch.eye(3, 4, device=self.device)
            self.appearance = torch.nn.Parameter(eye.repeat(len(data), 1, 1))
            self.app_opt = torch.optim.Adam([self.appearance], lr=config.lr_appearance)
        self.generator = torch.Generator().manual_seed(config.seed)
        # Training pixels drawn where the error is (instant-ngp); masks keep uniform draws.
        share = config.error_map_share
        self.error_map = (
            ErrorMap(data, share) if data is not None and share > 0 and data.keep is None else None
        )
        self.step = 0
        self.n_rays = max(
            MIN_RAYS, min(config.max_rays_per_step, self.config.samples_per_step // 256)
        )
        self.train_s = 0.0  # training time over all runs, so a resumed job keeps its total
        self.eval_background = torch.tensor(background_rgb(config.background), device=self.device)
        self.last = RenderStats()
        self.curve: list[dict[str, float]] = []  # test PSNR over training time (filled by the job)
        self._warm_up()

    def _warm_up(self) -> None:
        # Build/load the compiled kernels now, so a first-use compile is not counted as training time.
        if self.backend == "ext":
            with torch.no_grad():
                x = torch.zeros(8, 3, device=self.device)
                self.field(
                    x, torch.nn.functional.normalize(torch.ones(8, 3, device=self.device), dim=1)
                )
                self.grid.is_occupied(x)

    @staticmethod
    def _camera_distances(c2w: torch.Tensor) -> torch.Tensor:
        """(M,) each camera's distance from the scene box's centre (the origin)."""
        return c2w[:, :3, 3].double().norm(dim=1)

    def _mark_unseen(self, data: Dataset) -> None:
        # Cells no training camera sees stay empty: no ray marches through them and no grid
        # update spends density evaluations on them (instant-ngp's mark_untrained_density_grid).
        views = data.pinhole_views()
        if views is None:  # a lens past 90 degrees: counted as seeing everything, as instant-ngp
            return
        intrinsics, sizes = views
        # The cameras' planes are computed where the dataset lives (the host) and the grid
        # takes them to its device.
        self.grid.mark_unseen(
            data.c2w,
            intrinsics,
            sizes,
            near=self.config.occupancy_view_share * self._camera_distances(data.c2w),
            min_views=self.config.occupancy_min_views,
        )
        log.info("occupancy grid: %.1f %% of the cells unseen", 100 * self.unseen_fraction)

    @property
    def unseen_fraction(self) -> float:
        """Share of the occupancy grid's cells no training camera sees (kept empty)."""
        return float((self.grid.density < 0).float().mean())

    # -- optimisation --------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        # Exponential decay from lr to lr * lr_final_factor over the run: the planned steps, or
        # the time limit when that ends the run first (or always, when no steps are planned).
        c = self.config
        frac = step / c.steps if c.steps else 0.0
        if self.lr_horizon_s:
            frac = max(frac, self.budget_used_s / self.lr_horizon_s)
        elif c.time_limit_s or not c.steps:  # no job around it (scripts): the config's budget
            frac = max(frac, self.train_s / time_limit(c.time_limit_s, self.device))
        frac = min(frac, 1.0)
        return c.lr * c.lr_final_factor**frac

    def _background(self, n: int) -> torch.Tensor:
        mode = self.config.train_background
        if self.data is not None and self.data.has_alpha and mode == "random":
            # Random colours behind transparent pixels stop the field from baking a
            # background colour into semi-transparent density.
            return torch.rand(n, 3, generator=self.generator).to(self.device)
        rgb = background_rgb(mode if mode != "random" else self.config.background)
        return torch.tensor(rgb, device=self.device).expand(n, 3).contiguous()

    def _update_grid(self) -> None:
        self.grid.update_every_n_steps(
            self.step,
            self.field.density_float32,
            n=self.config.occupancy_update_every,
            warmup_steps=self.config.occupancy_warmup_steps,
            decay=self.config.occupancy_decay,
            threshold=self.config.occupancy_threshold,
        )

    def train_step(self) -> dict[str, float]:
        """One batch. Returns loss, psnr, rays, samples (marched and kept) and seconds."""
        t0 = time.perf_counter()
        self.field.train()
        self._update_grid()
        n = self.n_rays
        jitter = float(self.config.pixel_jitter)
        if self.error_map is not None:
            o, d, rgba, drawn = self.error_map.sample(n, self.generator, jitter)
        else:
            o, d, rgba, drawn = self.data.sample(n, self.generator, jitter=jitter, with_index=True)
        o, d, rgba = o.to(self.device), d.to(self.device), rgba.to(self.device)
        bg = self._background(n)
        target = composite_background(rgba, bg)
        lr = self.lr_at(self.step)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.table_opt.lr = lr
        rgb, _, _, stats, samples = render_rays(
            self.field,
            self.grid,
            o,
            d,
            bg,
            step=self.step_size,
            cone_angle=self.config.cone_angle,
            max_step=self.max_step,
            max_samples=self.config.max_samples_per_ray,
            stratified=True,
            alpha_threshold=self.config.alpha_threshold,
            with_samples=True,
            near=self.config.near_distance,
            grad_scale_distance=self.config.near_gradient_distance,
        )
        if self.appearance is not None:  # each ray's photo's exposure / white balance
            a = self.appearance.index_select(0, self.data.image_of(drawn).to(self.device))
            rgb = torch.baddbmm(a[:, :, 3:], a[:, :, :3], rgb[:, :, None])[:, :, 0]
        loss = F.mse_loss(rgb, target)
        mse = loss.detach()
        if self.appearance is not None:
            # The transforms' mean stays the identity: the field keeps the colours of an average
            # photo, which is what renders without a transform (held-out views) show.
            eye = torch.eye(3, 4, device=self.device)
            loss = loss + APPEARANCE_MEAN_WEIGHT * ((self.appearance.mean(0) - eye) ** 2).sum()
        # On a GPU the samples are all marched ones, the hidden flagged (render_rays): whether
        # any was kept is read with the loss at the end, not here.
        on_host = isinstance(stats.kept, int)
        has_samples = stats.kept if on_host else stats.marched
        dist_weight = self.config.distortion_loss
        if dist_weight > 0 and has_samples:
            w = render_weights(samples.sigma, samples.t_starts, samples.t_ends, samples.offsets)
            loss = (
                loss
                + dist_weight
                * distortion(w, samples.t_starts, samples.t_ends, samples.offsets).mean()
            )
        if self.error_map is not None:
            self.error_map.update(drawn, ((rgb.detach() - target) ** 2).mean(-1).cpu())
        self.opt.zero_grad(set_to_none=True)
        self.table_opt.zero_grad()
        if self.appearance is not None:
            self.app_opt.zero_grad(set_to_none=True)
        if has_samples:
            loss.backward()
            self.opt.step()
            self.table_opt.step()
            if self.appearance is not None:
                self.app_opt.step()
        self.step += 1
        # The step's one read of device values (loss and kept samples together).
        if on_host:
            mse = float(mse)
        else:
            mse, kept = torch.stack([mse.double(), stats.kept.double()]).tolist()
            stats = RenderStats(stats.n_rays, stats.marched, int(kept))
        self.last = stats
        # Batch sized by samples: rays next step = target / samples per ray now (smoothed).
        per_ray = max(stats.kept / n, 1.0)
        want = self.config.samples_per_step / per_ray
        self.n_rays = int(min(max(0.5 * n + 0.5 * want, MIN_RAYS), self.config.max_rays_per_step))
        dt = time.perf_counter() - t0
        self.train_s += dt
        return {
            "loss": mse,
            "psnr": psnr(mse),
            "rays": n,
            "samples_per_ray": stats.kept / n,
            "marched_per_ray": stats.marched / n,
            "seconds": dt,
        }

    # -- checkpoint state ----------------------------------------------------------------
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors = {f"field.{k}": v for k, v in self.field.state_dict().items()}
        tensors.update({f"grid.{k}": v for k, v in self.grid.state_dict().items()})
        sd = self.opt.state_dict()
        for idx, st in sd["state"].items():
            for key, value in st.items():
                tensors[f"opt.{idx}.{key}"] = (
                    value if torch.is_tensor(value) else torch.tensor(value)
                )
        tensors.update({f"table_opt.{k}": v for k, v in self.table_opt.state_dict().items()})
        tensors["rng.generator"] = self.generator.get_state()
        if self.error_map is not None:
            tensors["error_map"] = self.error_map.error
        if self.appearance is not None:
            tensors["appearance"] = self.appearance.detach()
            for key, value in self.app_opt.state_dict()["state"].get(0, {}).items():
                tensors[f"app_opt.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
        tensors["rng.torch"] = torch.get_rng_state()
        meta = {
            "kind": "nerf",
            "state_format": STATE_FORMAT,
            "config": config_dict(self.requested_config),
            "cone_angle": self.config.cone_angle,
            "near_distance": self.config.near_distance,
            "log2_hashmap_size": self.config.log2_hashmap_size,
            "budget_used_s": round(self.budget_used_s, 3),
            "step": self.step,
            "n_rays": self.n_rays,
            "train_s": round(self.train_s, 3),
            "curve": self.curve,
            "aabb_half": self.half,
            "step_size": self.step_size,
            "max_step": self.max_step,
            "normalization": self.meta.get(
                "normalization", {"scale": 1.0, "offset": [0.0, 0.0, 0.0]}
            ),
            "grid": {
                "resolution": self.grid.resolution,
                "n_cascades": self.grid.n_cascades,
                "half": self.grid.half[0],
                "n_updates": int(self.grid.n_updates),
            },
            "camera": default_camera(self.meta),
            "world_up": self.meta.get("world_up"),
            "opt_param_groups": sd["param_groups"],
        }
        return tensors, meta

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
        load_field_and_grid(self.field, self.grid, tensors, self.device)
        state: dict[int, dict[str, torch.Tensor]] = {}
        for k, v in tensors.items():
            if k.startswith("opt."):
                _, idx, key = k.split(".", 2)
                state.setdefault(int(idx), {})[key] = v
        self.opt.load_state_dict({"state": state, "param_groups": meta["opt_param_groups"]})
        self.table_opt.load_state_dict(
            {k[10:]: v for k, v in tensors.items() if k.startswith("table_opt.")}
        )
        self.generator.set_state(tensors["rng.generator"])
        if self.error_map is not None and "error_map" in tensors:
            self.error_map.error = tensors["error_map"].clone()
        if self.appearance is not None and "appearance" in tensors:
            with torch.no_grad():
                self.appearance.copy_(tensors["appearance"])
            app = {k[8:]: v for k, v in tensors.items() if k.startswith("app_opt.")}
            if app:
                sd = self.app_opt.state_dict()
                self.app_opt.load_state_dict(
                    {"state": {0: app}, "param_groups": sd["param_groups"]}
                )
        torch.set_rng_state(tensors["rng.torch"])
        self.step = int(meta["step"])
        self.n_rays = int(meta["n_rays"])
        self.train_s = float(meta.get("train_s", 0.0))
        self.budget_used_s = float(meta.get("budget_used_s", 0.0))
        self.curve = list(meta.get("curve", []))


def load_field_and_grid(
    field: NerfField, grid: OccupancyGrid, tensors: dict[str, torch.Tensor], device
) -> None:
    field.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("field.")})
    grid.load_state_dict({k[5:]: v for k, v in tensors.items() if k.startswith("grid.")})
    field.to(device)
    grid.to(device)


def default_camera(meta: dict[str, Any]) -> dict[str, Any]:
    """The first training frame's intrinsics: renders without intrinsics reuse its field of view."""
    frames = [f for f in meta.get("frames", []) if f.get("split", "train") == "train"] or meta.get(
        "frames", []
    )
    if not frames:
        return {"w": 100, "h": 100, "fx": 137.4, "fy": 137.4}
    f = frames[0]
    return {
        "w": int(f["w"]),
        "h": int(f["h"]),
        "fx": float(f["fx"]),
        "fy": float(f["fy"]),
        "cx": float(f["cx"]),
        "cy": float(f["cy"]),
    }
