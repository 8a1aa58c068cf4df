"""Render request types (issue 3 for image jobs, issue 5 for scene kinds).

Image jobs read only width/height/format. Scene kinds add a camera in the dataset's own world
frame (OpenGL axes: x right, y up, camera looks down -z) and intrinsics beside it. Degenerate
cameras are rejected here, so every kind gets the same 422s."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# One definition of a pose for every request: c2w must be rigid, and look_at/orbit without `up`
# take the dataset's own world up (Blender scenes are z-up, COLMAP ones mostly -y).
from api_schemas.camera import Orbit
from api_schemas.camera import Pose as Camera


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
        None, description="colour behind the scene; default white"
    )

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
    camera: Camera | None = Field(
        None, description="required for scene kinds, refused by image jobs"
    )
    format: Literal["png", "jpeg"] = "png"


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
