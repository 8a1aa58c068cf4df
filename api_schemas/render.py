"""Render request types. Image jobs use width/height; camera kinds add `camera`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Camera(BaseModel):
    """Pinhole camera in the dataset's own world frame (OpenGL axes, camera-to-world)."""

    model_config = ConfigDict(extra="forbid")

    c2w: list[list[float]] = Field(..., description="4x4 (or 3x4) camera-to-world matrix")
    fov_x: float | None = Field(None, gt=0, lt=3.14159, description="horizontal field of view, radians")
    fx: float | None = Field(None, gt=0)
    fy: float | None = Field(None, gt=0)
    cx: float | None = None
    cy: float | None = None


class RenderRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    width: int = Field(..., ge=1, le=16384)
    height: int = Field(..., ge=1, le=16384)
    camera: Camera | None = None
    format: Literal["png", "jpeg"] = "png"


class PathRequest(BaseModel):
    """A camera path rendered as an animation."""

    model_config = ConfigDict(extra="forbid")

    width: int = Field(..., ge=1, le=4096)
    height: int = Field(..., ge=1, le=4096)
    cameras: list[Camera] | None = None
    frames: int = Field(30, ge=1, le=600)
    fps: int = Field(15, ge=1, le=60)
    format: Literal["gif", "mp4", "webp"] = "gif"
