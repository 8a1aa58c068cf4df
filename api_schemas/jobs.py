"""Job wire types shared by the API, the worker and clients."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field


class JobKind(str, Enum):
    image = "image"
    nerf = "nerf"
    splat = "splat"


class JobStatus(str, Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


class Progress(BaseModel):
    # "sfm" (structure from motion, for photos without poses and videos), then "train"; step
    # and total_steps count within the stage.
    stage: str | None = None
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    psnr: float | None = None
    elapsed_s: float = 0.0
    eta_s: float | None = None
    # Scene kinds (nerf) also report throughput.
    rays_per_s: float | None = None
    samples_per_ray: float | None = None
    checkpoint_step: int | None = Field(
        None, description="newest checkpoint written: what a render of the running job shows"
    )


class Job(BaseModel):
    id: str
    kind: JobKind
    status: JobStatus = JobStatus.queued
    created_at: datetime
    updated_at: datetime
    config: dict[str, Any] = Field(
        default_factory=dict, description="effective config, defaults filled in"
    )
    progress: Progress = Field(default_factory=Progress)
    metrics: dict[str, Any] = Field(default_factory=dict, description="final metrics (image: psnr)")
    error: str | None = Field(None, description="readable message when failed")
    dataset: dict[str, Any] = Field(
        default_factory=dict, description="what intake found in the upload"
    )


class JobList(BaseModel):
    items: list[Job]
    total: int
    limit: int
    offset: int
    next_cursor: str | None = Field(
        None, description="pass as `cursor` for the next page; null on the last page"
    )
