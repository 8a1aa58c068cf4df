"""Config of a `kind=splat` job (3D Gaussian splatting). Defaults follow the 3DGS paper, with the
schedule scaled to `steps` (densify until half-way, opacity reset every `opacity_reset_every`).

Step numbers of the schedule (densify_from/every, opacity_reset_every, sh_increase_every) are
those of a run reaching `steps`; when the time budget ends the run first they scale with it (the
schedule's position is `steps` x the larger of the steps and the budget fractions done). A job
that sets no `steps` trains until its budget ends, on a schedule SCHEDULE_STEPS long positioned
the same way; a worker fast enough to run its course goes on at its end (final learning rate, no
more densification) until the budget ends. Positioned by the budget alone, a CPU run refined its
Gaussians every few steps and grew them past what its steps could train (docs/splat.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from api_schemas.nerf import TIME_LIMIT_HELP, Background, TrainingImages

# The schedule's length in steps when a job sets no `steps` (it trains until its budget): the
# step numbers of the schedule (densify_every, sh_increase_every, ...) are read against it.
SCHEDULE_STEPS = 3000
# densification thresholds on the mean view-space (NDC) gradient: 3DGS's, and gsplat's with absgrad
GRAD_THRESHOLD = 2e-4
ABSGRAD_THRESHOLD = 8e-4


class SplatConfig(TrainingImages):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    steps: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="training steps (one image per step); null: train until the time budget "
        f"ends, on the schedule of {SCHEDULE_STEPS} steps (or of the budget, when that ends first)",
    )
    time_limit_s: float | None = Field(None, gt=0, description=TIME_LIMIT_HELP)
    seed: int = Field(0, ge=0)

    # Initialisation
    init: Literal["auto", "random", "points3d"] = Field(
        "auto",
        description="auto: COLMAP points3D.txt when the upload has one, else random points in the scene box",
    )
    seed_points: Literal["auto", "random", "triangulate"] = Field(
        "auto",
        description="auto: a posed upload without sparse points gets SIFT matches triangulated "
        "with its known cameras as seeds (init auto); triangulate: also when it has points "
        "(they are replaced as seeds); random: never. A failure falls back to random points",
    )
    seed_max_s: float = Field(
        60.0,
        gt=0,
        le=7200,
        description="cap on triangulating seeds (also at most a quarter of time_limit_s)",
    )
    n_init_points: int = Field(20_000, ge=1, le=2_000_000, description="random initialisation")
    init_extent: float = Field(
        0.5, gt=0, le=1.0, description="random points fill this fraction of the scene box"
    )
    sh_degree: int = Field(3, ge=0, le=3)
    sh_increase_every: int = Field(500, ge=1, description="one more SH band every this many steps")

    # Adam learning rates per parameter (3DGS); means' rate is relative to the scene extent.
    lr_means: float = Field(1.6e-4, gt=0, le=1.0)
    lr_means_final: float = Field(1.6e-6, gt=0, le=1.0)
    lr_sh_dc: float = Field(2.5e-3, gt=0, le=1.0)
    lr_sh_rest: float = Field(2.5e-3 / 20, gt=0, le=1.0)
    lr_opacity: float = Field(0.05, gt=0, le=1.0)
    lr_scales: float = Field(5e-3, gt=0, le=1.0)
    lr_quats: float = Field(1e-3, gt=0, le=1.0)
    lambda_dssim: float = Field(0.2, ge=0, le=1.0)

    # Densification and pruning
    densify_from: int = Field(100, ge=0)
    densify_until: float = Field(0.5, gt=0, le=1.0, description="fraction of `steps`")
    densify_every: int = Field(100, ge=1)
    densify_grad_threshold: float | None = Field(
        None,
        gt=0,
        description="mean view-space (NDC) gradient norm that densifies; null: "
        f"{GRAD_THRESHOLD:g}, or {ABSGRAD_THRESHOLD:g} with absgrad (gsplat's grow_grad2d)",
    )
    absgrad: bool = Field(
        False,
        description="densify on each pixel's |gradient| summed (gsplat's absgrad) instead of the "
        "summed gradient, so pixels pulling a Gaussian opposite ways do not cancel",
    )
    percent_dense: float = Field(
        0.01, gt=0, le=1.0, description="clone below / split above this scene fraction"
    )
    prune_opacity: float = Field(0.005, gt=0, lt=1.0)
    prune_screen_size: float = Field(
        0.1, gt=0, le=4.0, description="prune splats whose radius exceeds this image fraction"
    )
    prune_world_size: float = Field(
        0.1, gt=0, le=10.0, description="prune splats larger than this scene fraction"
    )
    opacity_reset_every: int = Field(
        1000,
        ge=1,
        description="reset opacities to <= 0.01 every this many schedule steps while densifying; "
        "large splats are pruned only after the first",
    )
    max_gaussians: int = Field(
        300_000, ge=1, le=10_000_000, description="strategy default: the most Gaussians"
    )

    # MCMC (3DGS as Markov chain Monte Carlo, gsplat's MCMCStrategy): every densify_every steps
    # of the densify window, dead Gaussians (opacity <= prune_opacity) are relocated onto live
    # ones and 5 % more are added until cap_max; no clone/split, pruning or opacity resets.
    strategy: Literal["default", "mcmc"] = Field(
        "default",
        description="default: 3DGS clone/split/prune and opacity resets; mcmc: relocation with a "
        "hard cap (cap_max), so memory and render time are known up front",
    )
    cap_max: int = Field(
        50_000, ge=1, le=10_000_000, description="mcmc: the number of Gaussians it grows to"
    )
    mcmc_noise_lr: float = Field(
        5e5, ge=0, description="mcmc: position noise scale, times the means' learning rate"
    )
    mcmc_opacity_reg: float = Field(0.01, ge=0, description="mcmc: L1 weight on opacities")
    mcmc_scale_reg: float = Field(0.01, ge=0, description="mcmc: L1 weight on scales")

    # Images and compositing
    train_resolution: int | None = Field(
        None, ge=16, le=4096, description="train on images downscaled to this width"
    )
    train_background: Literal["random", "white", "black"] = "random"
    background: Background = "white"
    antialiased: bool = Field(
        False,
        description="mip-splatting's 2D filter with opacity compensation (gsplat's antialiased "
        "mode) in training and every render; recorded in checkpoints and exported files",
    )
    appearance: bool = Field(
        False,
        description="per-image affine colour transform (auto exposure, white balance) learnt "
        "in training only; renders and held-out scores use none",
    )
    lr_appearance: float = Field(
        1e-2,
        gt=0,
        le=1.0,
        description="Adam rate of the transforms (each photo trains 1 step in N)",
    )
    method: Literal["tiled", "naive", "reference"] = Field(
        "tiled", description="compositor used for training"
    )

    # Bookkeeping
    checkpoint_every: int = Field(1000, ge=1, le=1_000_000)
    n_test_renders: int = Field(4, ge=0, le=64)
    aabb_scale: int | None = Field(
        None, description="override the dataset's box half size (1, 2, 4, ... 128)"
    )
