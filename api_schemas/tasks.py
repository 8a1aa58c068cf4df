"""The Celery task contract: each task's name and payload, shared by the API (sender) and the
workers (receiver).

A message carries its payload as keyword arguments, `task.model_dump(mode="json",
exclude_none=True)`; the worker validates it with `Task.model_validate(...)` before any work. The
argument names are the task functions' parameter names, so a message queued in the older
positional form (`args=[job_id, ...]`) binds to the same fields and validates too. A new field
must be optional with its default stated here, so messages already queued keep validating; a
renamed task or field needs both names accepted for a release."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from api_schemas.render import PathRequest, RenderRequest


class Task(BaseModel):
    """A task's payload; `name` is the Celery task name (stable across releases)."""

    model_config = ConfigDict(extra="forbid")

    name: ClassVar[str]
    job_id: str


class PreprocessTask(Task):
    """Structure from motion for an upload without poses; sends TrainTask when done."""

    name: ClassVar[str] = "nf.preprocess"


class TrainTask(Task):
    name: ClassVar[str] = "nf.train"


class ExportTask(Task):
    name: ClassVar[str] = "nf.export"
    export_id: str


class RenderTask(Task):
    """One frame, answered through the result backend (the API waits for it)."""

    name: ClassVar[str] = "nf.render"
    request: RenderRequest


class RenderPathTask(Task):
    """A camera path, answered through the result backend."""

    name: ClassVar[str] = "nf.render_path"
    request: PathRequest


class RenderPathJobTask(Task):
    """A camera path rendered to the artifact of render job `render_id` (core/path_jobs.py)."""

    name: ClassVar[str] = "nf.render_path_job"
    render_id: str
    request: PathRequest


class RenderFrameJobTask(Task):
    """One large frame rendered in tiles to the artifact of render job `render_id`."""

    name: ClassVar[str] = "nf.render_frame_job"
    render_id: str
    request: RenderRequest


def payload(task: Task) -> dict:
    """The message's keyword arguments (None fields left out: they mean the schema's default)."""
    return task.model_dump(mode="json", exclude_none=True)
