"""Config of a `kind=nerf` job (instant-ngp-style field). Defaults follow issue 5 / instant-ngp."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Wall-time budget of a training job that sets no `time_limit_s`, by the worker's device: minutes
# on a CPU; a GPU trains many more steps in its budget.
DEFAULT_TIME_LIMIT_S = {"cpu": 300.0, "cuda": 1200.0}
# Samples per training step a job that sets no `samples_per_step` targets, by the worker's
# device: instant-ngp's 2^18 on a GPU; a CPU step of that size would take seconds.
DEFAULT_SAMPLES_PER_STEP = {"cpu": 1 << 16, "cuda": 1 << 18}
# Cone angle (march steps grow as t * this) of a scene box larger than the unit cube when a job
# sets none, by the worker's device: instant-ngp's 1/256 on a GPU; on a CPU, whose steps hold
# 4x fewer samples, 1/64, which on the capture-like scene kept ~3x fewer samples a ray through
# the room and so ~3x more rays a step, at the same seconds a step (docs/nerf.md).
DEFAULT_CONE_ANGLE = {"cpu": 1.0 / 64.0, "cuda": 1.0 / 256.0}
# What a scene whose box is larger than the unit cube (a capture with its surroundings) gets when
# a job sets none, measured on instant-ngp's fox at equal steps (docs/nerf.md, "Real captures"):
# the distortion loss's weight (without it the room is a fog of ~100 kept samples a ray, so ~3x
# fewer rays a step, and held-out views score ~3 dB lower) and the near plane.
SCENE_DISTORTION_LOSS = 0.01
SCENE_NEAR_DISTANCE = 0.2
SCENE_MIN_VIEWS = 2
SCENE_GRADIENT_DISTANCE = 1.0
TIME_LIMIT_HELP = (
    "wall-time budget in seconds from the start of training, test-curve points, checkpoints and "
    "the final evaluation included (the job may end up to max(10 s, 5 %) later); default "
    f"{DEFAULT_TIME_LIMIT_S['cpu']:.0f} s on a CPU worker, {DEFAULT_TIME_LIMIT_S['cuda']:.0f} s on a GPU"
)

Unit = Annotated[float, Field(ge=0.0, le=1.0)]
# A named colour or linear RGB in [0, 1].
Background = Literal["white", "black"] | tuple[Unit, Unit, Unit]


class TrainingImages(BaseModel):
    """The size scene photos are stored and trained at; intrinsics are scaled to match."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    long_side: int | None = Field(
        None,
        ge=16,
        le=8192,
        description="downsize photos to at most this long side; null: the deployment's "
        "TRAIN_LONG_SIDE",
    )
    downscale: int | None = Field(
        None,
        ge=1,
        le=64,
        description="divide both sides by this instead (nerfstudio's images_N / downscale_factor)",
    )

    @model_validator(mode="after")
    def _one_size_rule(self):
        if self.long_side is not None and self.downscale is not None:
            raise ValueError("give long_side or downscale, not both")
        return self


class NerfConfig(TrainingImages):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # Optimisation
    steps: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="training steps; null: train until the time budget ends (the learning-rate "
        "schedule follows that horizon)",
    )
    lr: float = Field(
        2e-2,
        gt=0,
        le=1.0,
        description="Adam's rate at the start, for the hash table and the MLPs (twice "
        "instant-ngp's: a CPU worker's few thousand steps converge in time at it)",
    )
    lr_final_factor: float = Field(
        0.3,
        gt=0,
        le=1.0,
        description="lr decays exponentially to lr * this at the end of the run (the planned "
        "steps or the time budget)",
    )
    adam_betas: tuple[float, float] = (0.9, 0.99)
    adam_eps: float = Field(1e-15, gt=0, le=1e-3)
    weight_decay: float = Field(
        1e-6, ge=0, le=1.0, description="on MLP weights only (not the hash tables)"
    )
    pixel_jitter: float = Field(
        1.0,
        ge=0,
        le=1,
        description="training rays pass through random points of a square this wide (in "
        "pixels) around each pixel's centre: 1 the whole pixel, whose photo value integrates its "
        "area (instant-ngp); 0 pixel centres only, which a field can fit ray by ray and then "
        "decays on new views",
    )
    error_map_share: float = Field(
        0.0,
        ge=0,
        le=0.9,
        description="share of each batch's rays drawn from 32x32 cells of the training images "
        "in proportion to their running error (instant-ngp's error map), the rest uniformly; 0: "
        "all uniform. Uploads with masks always draw uniformly",
    )
    distortion_loss: float | None = Field(
        None,
        ge=0,
        le=1.0,
        description="weight of mip-NeRF 360's distortion loss (each ray's weights pulled into a "
        "short stretch; worker/nerf/losses.py), mean over the batch's rays; 0: off; null: "
        f"{SCENE_DISTORTION_LOSS} when the scene box is larger than the unit cube (a capture "
        "with a background), else 0",
    )
    samples_per_step: int | None = Field(
        None,
        ge=1024,
        le=1 << 22,
        description="target number of samples per batch; rays per batch adapt to it; default "
        f"{DEFAULT_SAMPLES_PER_STEP['cpu']} on a CPU worker, {DEFAULT_SAMPLES_PER_STEP['cuda']} "
        "on a GPU (instant-ngp)",
    )
    max_rays_per_step: int = Field(16_384, ge=64, le=1 << 20)
    time_limit_s: float | None = Field(None, gt=0, description=TIME_LIMIT_HELP)
    seed: int = Field(0, ge=0)

    # Hash grid encoding
    n_levels: int = Field(16, ge=1, le=32)
    features_per_level: Literal[1, 2, 4, 8] = 2
    log2_hashmap_size: int | None = Field(
        None,
        ge=14,
        le=24,
        description="hash table size per level, 2^14 to 2^24 (kernels.HashGrid); default by the "
        "training pixels P: floor(log2 P) - 2 within 14..19, so a hashed level holds about P/4 "
        "to P/8 rows (instant-ngp's 2^19 from 2^21 training pixels up)",
    )
    base_resolution: int = Field(16, ge=2, le=1024)
    max_resolution: int = Field(
        2048, ge=2, le=1 << 16, description="finest level resolution (per unit box)"
    )

    # Networks
    density_hidden: int = Field(64, ge=8, le=512)
    density_layers: int = Field(1, ge=1, le=8)
    geo_features: int = Field(
        15, ge=1, le=128, description="geometry features passed to the colour MLP"
    )
    color_hidden: int = Field(64, ge=8, le=512)
    color_layers: int = Field(2, ge=1, le=8)
    mlp_precision: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description=(
            "CPU MLPs. auto: bfloat16 products (float32 sums) in the fused op on CPUs with AVX-512 "
            "BF16, float32 elsewhere; bfloat16: the same, or nn.Linear under bfloat16 autocast "
            "without AVX-512 BF16; float32: the fused op in float32"
        ),
    )
    sh_degree: int = Field(
        4,
        ge=1,
        le=4,
        description="SH bands of the direction encoding (degree**2 coefficients; the kernel has 1-4)",
    )

    # Occupancy grid and ray marching
    occupancy_resolution: int | None = Field(
        None,
        ge=16,
        le=512,
        description="cells per side of each occupancy cascade (a power of two); null: 128, or 64 "
        "on a CPU when the scene box is larger than the unit cube (several cascades, whose "
        "updates would otherwise cost a quarter of a CPU step)",
    )
    occupancy_min_views: int | None = Field(
        None,
        ge=1,
        le=64,
        description="training cameras that must see an occupancy cell for it to hold density; "
        "a region one photo alone sees can hold whatever explains that photo (a floater in front "
        f"of other views). null: {SCENE_MIN_VIEWS} when the scene box is larger than the unit "
        "cube, else 1",
    )
    occupancy_view_share: float = Field(
        0.0,
        ge=0,
        le=1.0,
        description="a camera counts towards `occupancy_min_views` only for the cells in front "
        "of it by at least this share of its distance from the scene box's centre: a cell that "
        "only the cameras right behind it see is free to hold a floater that explains their "
        "photos; 0: from the camera on (the default: on the fox 0.6 lifted a 400-px, 300-s "
        "training by 3 dB and cost a 120-px, 60-s one 5.7; docs/nerf.md)",
    )
    occupancy_update_every: int = Field(16, ge=1, le=10_000)
    occupancy_warmup_steps: int = Field(256, ge=0)
    occupancy_threshold: float = Field(0.01, gt=0)
    occupancy_decay: float = Field(0.95, gt=0, lt=1)
    alpha_threshold: float = Field(
        0.0,
        ge=0,
        le=0.1,
        description="samples whose alpha over their step is below this are skipped, in training "
        "and rendering (nerfacc's alpha_thre); 0: none",
    )
    max_samples_per_ray: int = Field(
        1024, ge=16, le=8192, description="march step = box diagonal / this"
    )
    cone_angle: float | None = Field(
        None,
        ge=0,
        le=0.1,
        description="march step grows as t * cone_angle; default when the scene box is larger "
        "than the unit cube (aabb half size > 1): 1/64 on a CPU worker (fewer samples a ray "
        "through a room, so more rays a step), 1/256 on a GPU (instant-ngp); else 0 (constant "
        "steps)",
    )
    aabb_scale: int | None = Field(
        None, description="override the dataset's box half size (1, 2, 4, ... 128)"
    )
    near_distance: float | None = Field(
        None,
        ge=0,
        le=10.0,
        description="camera rays start this far from the camera (normalised units, the subject "
        "box is [-1, 1]^3), in training and every render: no density can grow right in front "
        "of one training camera to explain its photo alone; null: "
        f"{SCENE_NEAR_DISTANCE} when the scene box is larger than the unit cube (instant-ngp's "
        "near distance), else 0",
    )
    near_gradient_distance: float | None = Field(
        None,
        ge=0,
        le=10.0,
        description="samples nearer their camera than this (normalised units) pass back "
        '(t / this)^2 of their gradient in training ("Floaters No More", nerfstudio\'s '
        "gradient scaling): the many rays crossing a cell near one camera no longer grow a "
        f"floater there first; 0: off; null: {SCENE_GRADIENT_DISTANCE} when the scene box is "
        "larger than the unit cube, else 0",
    )

    # Backgrounds: random while training (RGBA data), fixed for evaluation and rendering.
    train_background: Literal["random", "white", "black"] = "random"
    background: Background = "white"

    appearance: bool | None = Field(
        False,
        description="per-image affine colour transform (auto exposure, white balance) learnt in "
        "training only; renders and held-out scores use none. null: on for photos without "
        "transparency (real captures), off for RGBA uploads",
    )
    lr_appearance: float = Field(1e-3, gt=0, le=1.0, description="Adam rate of the transforms")

    # Bookkeeping
    checkpoint_every: int = Field(500, ge=1, le=1_000_000)
    n_test_renders: int = Field(4, ge=0, le=64, description="test-split renders kept as artifacts")
    backend: Literal["ext", "reference"] = "ext"

    @field_validator("adam_betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError("adam betas must lie in [0, 1)")
        return v

    @field_validator("aabb_scale")
    @classmethod
    def _pow2(cls, v: int | None) -> int | None:
        if v is not None and (v < 1 or v > 128 or v & (v - 1)):
            raise ValueError("aabb_scale must be a power of two between 1 and 128")
        return v

    @field_validator("max_resolution")
    @classmethod
    def _max_res(cls, v: int, info) -> int:
        base = info.data.get("base_resolution")
        if base is not None and v < base:
            raise ValueError("max_resolution must be at least base_resolution")
        return v
