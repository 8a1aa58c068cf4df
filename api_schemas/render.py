"""Render request types (issue 3 for image jobs, issue 5 for scene kinds).

Image jobs read only width/height/format. Scene kinds add a camera in the dataset's own world
frame (OpenGL axes: x right, y up, camera looks down -z) and intrinsics beside it. Degenerate
cameras are rejected here, so every kind gets the same 422s."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Vec3 = tuple[float, float, float]


def _finite(values, what: str) -> None:
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{what} must be finite numbers")


def _norm(v) -> float:
    return math.sqrt(sum(x * x for x in v))


class LookAt(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eye: Vec3
    target: Vec3
    up: Vec3 = (0.0, 1.0, 0.0)

    @model_validator(mode="after")
    def _not_degenerate(self):
        _finite([*self.eye, *self.target, *self.up], "look_at")
        fwd = [t - e for t, e in zip(self.target, self.eye)]
        if _norm(fwd) < 1e-9:
            raise ValueError("look_at: eye and target are the same point")
        if _norm(self.up) < 1e-9:
            raise ValueError("look_at: up is zero")
        cross = (fwd[1] * self.up[2] - fwd[2] * self.up[1], fwd[2] * self.up[0] - fwd[0] * self.up[2],
                 fwd[0] * self.up[1] - fwd[1] * self.up[0])
        if _norm(cross) < 1e-6 * _norm(fwd) * _norm(self.up):
            raise ValueError("look_at: up is parallel to the viewing direction")
        return self


class Camera(BaseModel):
    """Exactly one of `c2w` (4x4 or 3x4 camera-to-world) or `look_at`."""

    model_config = ConfigDict(extra="forbid")

    c2w: list[list[float]] | None = None
    look_at: LookAt | None = None

    @field_validator("c2w")
    @classmethod
    def _shape(cls, m):
        if m is None:
            return m
        if len(m) not in (3, 4) or any(len(row) != 4 for row in m):
            raise ValueError("c2w must be 4x4 or 3x4")
        _finite([x for row in m for x in row], "c2w")
        return m

    @model_validator(mode="after")
    def _one(self):
        if (self.c2w is None) == (self.look_at is None):
            raise ValueError("camera needs exactly one of c2w or look_at")
        return self


class Intrinsics(BaseModel):
    """Field of view in degrees (horizontal or vertical), or pixel focal lengths; default: the dataset's."""

    fov_x_deg: float | None = Field(None, gt=0, lt=180)
    fov_y_deg: float | None = Field(None, gt=0, lt=180)
    fx: float | None = Field(None, gt=0)
    fy: float | None = Field(None, gt=0)
    cx: float | None = None
    cy: float | None = None
    output: Literal["rgb", "depth", "alpha"] = "rgb"
    background: Literal["white", "black"] | tuple[float, float, float] | None = Field(
        None, description="colour behind the scene; default white")

    @field_validator("background")
    @classmethod
    def _rgb(cls, v):
        if isinstance(v, tuple) and not all(0.0 <= x <= 1.0 for x in v):
            raise ValueError("background components must lie in [0, 1]")
        return v


class RenderRequest(Intrinsics):
    model_config = ConfigDict(extra="forbid")

    width: int = Field(..., ge=1, le=16384)
    height: int = Field(..., ge=1, le=16384)
    camera: Camera | None = Field(None, description="required for scene kinds, refused by image jobs")
    format: Literal["png", "jpeg"] = "png"


class Orbit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    center: Vec3 = (0.0, 0.0, 0.0)
    radius: float = Field(..., gt=0)
    elevation_deg: float = Field(20.0, gt=-90, lt=90)
    n_frames: int = Field(36, ge=1, le=720)
    up: Vec3 = (0.0, 1.0, 0.0)

    @model_validator(mode="after")
    def _finite_values(self):
        _finite([*self.center, self.radius, *self.up], "orbit")
        if _norm(self.up) < 1e-9:
            raise ValueError("orbit: up is zero")
        return self


class PathRequest(Intrinsics):
    """A camera path: a list of poses or an orbit; answered with an animated WebP or a zip of PNGs."""

    model_config = ConfigDict(extra="forbid")

    width: int = Field(..., ge=1, le=4096)
    height: int = Field(..., ge=1, le=4096)
    poses: list[Camera] | None = Field(None, min_length=1, max_length=720)
    orbit: Orbit | None = None
    format: Literal["webp", "zip", "gif", "mp4"] = "webp"
    fps: int = Field(24, ge=1, le=60)

    @model_validator(mode="after")
    def _one_path(self):
        if (self.poses is None) == (self.orbit is None):
            raise ValueError("give exactly one of poses or orbit")
        return self

    @property
    def frames(self) -> int:
        return len(self.poses) if self.poses is not None else self.orbit.n_frames
