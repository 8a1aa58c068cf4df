"""Cameras for render requests, in the dataset's own world frame (OpenGL axes, camera-to-world).

A degenerate camera fails validation (-> 422) with a message naming the problem. Pixel caps
depend on settings and are checked at the route, not here.

JSON shape (one flat object):
    {"c2w": [[...4 rows...]]}  or  {"look_at": {"eye": [..], "target": [..], "up": [..]}}
    + one of "fov_x_deg" | "fov_y_deg" | "fx" (+ "fy", "cx", "cy"); none: the dataset's training fov
    + "width", "height"
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Vec3 = tuple[float, float, float]
Unit = Annotated[float, Field(ge=0.0, le=1.0)]
Background = Literal["white", "black"] | tuple[Unit, Unit, Unit]
Output = Literal["rgb", "depth", "alpha"]
ImageFormat = Literal["png", "jpeg"]
RIGID_TOL = 1e-2  # clients send rounded matrices; the worker re-orthonormalises what passes
MAX_SIDE = 16384


def _norm(v) -> float:
    return math.sqrt(sum(x * x for x in v))


def _cross(a, b):
    return (a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LookAt(_Strict):
    eye: Vec3
    target: Vec3
    up: Vec3 | None = Field(None, description="world up; default: the dataset's average camera up")

    @model_validator(mode="after")
    def _not_degenerate(self) -> LookAt:
        view = tuple(t - e for t, e in zip(self.target, self.eye))
        if _norm(view) < 1e-9:
            raise ValueError("look_at: eye and target are the same point")
        if self.up is not None:
            if _norm(self.up) < 1e-9:
                raise ValueError("look_at: up is the zero vector")
            if _norm(_cross(view, self.up)) < 1e-6 * _norm(view) * _norm(self.up):
                raise ValueError("look_at: up is parallel to the viewing direction")
        return self


def check_c2w(m: list[list[float]]) -> list[list[float]]:
    """4x4 or 3x4, rigid (orthonormal rotation, det +1); returned as 4x4."""
    if len(m) not in (3, 4) or any(len(r) != 4 for r in m):
        raise ValueError("c2w must be a 4x4 or 3x4 matrix (rows of 4 numbers)")
    if len(m) == 4:
        if max(abs(a - b) for a, b in zip(m[3], (0, 0, 0, 1))) > 1e-6:
            raise ValueError("c2w last row must be [0, 0, 0, 1]")
    r = [row[:3] for row in m[:3]]
    for i in range(3):
        for j in range(3):
            dot = sum(r[k][i] * r[k][j] for k in range(3))
            if abs(dot - (1.0 if i == j else 0.0)) > RIGID_TOL:
                raise ValueError("c2w rotation part is not orthonormal (scaled or sheared camera)")
    det = (
        r[0][0] * (r[1][1] * r[2][2] - r[1][2] * r[2][1])
        - r[0][1] * (r[1][0] * r[2][2] - r[1][2] * r[2][0])
        + r[0][2] * (r[1][0] * r[2][1] - r[1][1] * r[2][0])
    )
    if det <= 0:
        raise ValueError("c2w rotation part is a reflection (determinant must be +1)")
    return [list(map(float, row)) for row in m[:3]] + [[0.0, 0.0, 0.0, 1.0]]


class Pose(_Strict):
    """Exactly one of `c2w` and `look_at`."""

    c2w: list[list[float]] | None = Field(
        None, description="4x4 or 3x4 camera-to-world, OpenGL axes"
    )
    look_at: LookAt | None = None

    @field_validator("c2w")
    @classmethod
    def _rigid(cls, v):
        return None if v is None else check_c2w(v)

    @model_validator(mode="after")
    def _one_pose(self):
        if (self.c2w is None) == (self.look_at is None):
            raise ValueError("give exactly one of c2w and look_at")
        return self


class Intrinsics(_Strict):
    """At most one of: fov_x_deg, fov_y_deg, or fx (with optional fy, cx, cy in pixels)."""

    fov_x_deg: float | None = Field(None, description="horizontal field of view, degrees, (0, 180)")
    fov_y_deg: float | None = Field(None, description="vertical field of view, degrees, (0, 180)")
    fx: float | None = None
    fy: float | None = None
    cx: float | None = None
    cy: float | None = None

    @field_validator("fov_x_deg", "fov_y_deg")
    @classmethod
    def _fov(cls, v, info):
        if v is not None and not 0 < v < 180:
            raise ValueError(f"{info.field_name} must be between 0 and 180 degrees (exclusive)")
        return v

    @field_validator("fx", "fy")
    @classmethod
    def _focal(cls, v, info):
        if v is not None and v <= 0:
            raise ValueError(f"{info.field_name} must be positive")
        return v

    @model_validator(mode="after")
    def _one_form(self):
        forms = [
            self.fov_x_deg is not None,
            self.fov_y_deg is not None,
            any(v is not None for v in (self.fx, self.fy, self.cx, self.cy)),
        ]
        if sum(forms) > 1:
            raise ValueError("give only one of fov_x_deg, fov_y_deg, or fx/fy/cx/cy")
        if forms[2] and self.fx is None and self.fy is None:
            raise ValueError("cx/cy need fx (or fy)")
        return self


class Camera(Pose, Intrinsics):
    """One rendered view: pose + intrinsics + image size."""

    width: int = Field(..., ge=1, le=MAX_SIDE)
    height: int = Field(..., ge=1, le=MAX_SIDE)


class Orbit(_Strict):
    """n_frames cameras on a circle around `center`, all looking at it."""

    center: Vec3 = (0.0, 0.0, 0.0)
    radius: float = Field(..., gt=0)
    elevation_deg: float = Field(20.0, gt=-90, lt=90, description="above the plane normal to `up`")
    n_frames: int = Field(36, ge=1, le=720)
    start_azimuth_deg: float = 0.0
    up: Vec3 | None = Field(
        None, description="orbit axis; default: the dataset's average camera up"
    )

    @field_validator("up")
    @classmethod
    def _up(cls, v):
        if v is not None and _norm(v) < 1e-9:
            raise ValueError("orbit up is the zero vector")
        return v


class RenderOptions(_Strict):
    output: Output = "rgb"
    background: Background = "white"
    format: ImageFormat = "png"
