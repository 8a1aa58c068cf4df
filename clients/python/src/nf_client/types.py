"""The service's wire types as the client reads them: plain dicts, typed with TypedDicts.

Each one is named after its schema in the committed OpenAPI document (clients/openapi.json), and
tests/clients/test_contract.py checks every field here against it: the name exists there, the
type agrees, and the schema's required fields are the required ones here. The JSON the server
sends is handed over as it is (a dict), so a field added on the server reaches a caller before
this file names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


class Progress(TypedDict, total=False):
    stage: str | None
    step: int
    total_steps: int
    loss: float | None
    psnr: float | None
    elapsed_s: float
    eta_s: float | None
    rays_per_s: float | None
    samples_per_ray: float | None
    checkpoint_step: int | None


class _JobRequired(TypedDict):
    id: str
    kind: str
    created_at: str
    updated_at: str


class Job(_JobRequired, total=False):
    status: JobStatus
    config: dict[str, Any]
    progress: Progress
    metrics: dict[str, Any]
    error: str | None
    dataset: dict[str, Any]


class JobList(TypedDict):
    items: list[Job]
    total: int
    limit: int
    offset: int
    next_cursor: str | None


class Upload(TypedDict):
    id: str
    part_size: int
    part_urls: list[str]
    expires_in_s: int
    complete_url: str


class _ExportRequired(TypedDict):
    id: str
    job_id: str
    format: str
    created_at: str
    updated_at: str


class Export(_ExportRequired, total=False):
    options: dict[str, Any]
    status: Literal["queued", "running", "succeeded", "failed"]
    artifact: str | None
    url: str | None
    size: int | None
    stats: dict[str, Any]
    error: str | None


class ExportList(TypedDict):
    items: list[Export]


class _PathJobRequired(TypedDict):
    id: str
    job_id: str
    status: Literal["queued", "running", "succeeded", "failed"]
    format: str
    n_frames: int
    url: str
    created_at: str
    updated_at: str


class PathJob(_PathJobRequired, total=False):
    """A render job: a camera path (`kind` path) or one large frame (`kind` frame)."""

    kind: Literal["path", "frame"]
    frames_done: int
    n_pixels: int | None
    pixels_done: int | None
    checkpoint_step: int | None
    artifact: str | None
    artifact_url: str | None
    error: str | None


class _LookAtRequired(TypedDict):
    eye: list[float]
    target: list[float]


class LookAt(_LookAtRequired, total=False):
    up: list[float] | None


class Pose(TypedDict, total=False):
    """A camera: `c2w` (4x4 or 3x4 camera-to-world, OpenGL axes) or `look_at`."""

    c2w: list[list[float]] | None
    look_at: LookAt | None


class _OrbitRequired(TypedDict):
    radius: float


class Orbit(_OrbitRequired, total=False):
    center: list[float]
    elevation_deg: float
    n_frames: int
    up: list[float] | None
    start_azimuth_deg: float


class Artifact(TypedDict):
    """One entry of `GET /v1/jobs/{id}/artifacts` (its answer is not a named schema)."""

    name: str
    size: int
    url: str


@dataclass
class Event:
    """One server-sent event of a job's stream: `status`, `progress`, then `end` (the job)."""

    event: str
    data: Any
    id: int | None = None


@dataclass
class Rendered:
    """A rendered file: a frame, an animation, an MP4 or a zip of frames."""

    content: bytes
    content_type: str | None = None
    checkpoint_step: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
