"""Config of the 2D image field job (seed 001)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ImageConfig(BaseModel):
    # Unknown keys are a client mistake (typos would silently train the default).
    model_config = ConfigDict(extra="forbid")

    encoding: Literal["fourier", "none"] = "fourier"
    steps: int = Field(2000, ge=1, le=200_000)
    num_frequencies: int = Field(6, ge=1, le=16)
    hidden: int = Field(128, ge=8, le=1024)
    layers: int = Field(4, ge=2, le=16)
    lr: float = Field(5e-4, gt=0, le=1.0)
    resolution: int = Field(64, ge=8, le=1024, description="longest side trained at")
