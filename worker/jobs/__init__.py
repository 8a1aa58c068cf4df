"""Job kinds on the worker side (`api_schemas.kinds` lists them; "image" -> worker.jobs.image,
imported on first use), plus the objects the task layer hands to a kind module. The scene kinds
(nerf, splat) are thin subclasses of worker.jobs.scene.SceneJob.

A kind module exposes (itself, or as methods of its `JOB` object):
  train(ctx: JobContext) -> dict            final metrics; raise to fail the job
  render(job, checkpoint, request) -> (bytes, content_type)
  render_path(job, checkpoint, request) -> (bytes, content_type)   optional
  render_path_to(job, checkpoint, request, out, on_frame) -> content_type   optional: path jobs
`request` is the task's typed api_schemas.render.RenderRequest (render) or PathRequest (paths).
Client mistakes inside render raise RenderError(status_code, detail).
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from functools import cached_property
from types import ModuleType
from typing import Any

from api_schemas.jobs import Job, JobKind
from core import leases
from core.settings import Settings
from core.storage import JobPaths
from core.store import CancelFlag, JobStore
from worker.configs import Config, job_config
from worker.errors import RenderError  # noqa: F401  (kind modules raise it from here)


class UnknownKind(LookupError):
    pass


class JobCancelled(Exception):
    """Raised by ctx.raise_if_cancelled(); the task marks the job cancelled."""


# Raised by ctx.raise_if_cancelled() once the job's train lease is no longer this worker's
# (core.leases.Claim.lost), and by any fenced write the database refused (core.store's
# `fenced`): another worker may be training it, so this one stops without touching the job's
# state, checkpoints or artifacts.
LeaseLost = leases.LeaseLost


class JobInterrupted(Exception):
    """Raised by ctx.raise_if_cancelled() once the worker is shutting down (SIGTERM): the task
    puts the job back in the queue and it resumes from its checkpoint."""


# Set in a pool process when its worker is told to stop (worker/tasks.py installs the handler).
STOP = threading.Event()


def get_kind_module(kind: str) -> ModuleType:
    if kind not in {k.value for k in JobKind}:
        raise UnknownKind(f"no worker support for job kind {kind!r}")
    name = f"worker.jobs.{kind}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            raise UnknownKind(f"no worker support for job kind {kind!r}") from None
        raise


def kind_function(kind: str, name: str):
    """The kind's `train` / `render` / `render_path` / `render_path_to`, or None where it has
    none. A module with a `JOB` object (the scene kinds' SceneJob) is answered by that object."""
    module = get_kind_module(kind)
    return getattr(getattr(module, "JOB", module), name, None)


@dataclass
class JobContext:
    """Everything a trainer needs; built by worker.tasks for one nf.train run."""

    job: Job  # the job as it was when training started (job.config: the stored dict)
    paths: JobPaths  # .dataset, .checkpoints, .artifacts, .root ...
    settings: Settings
    store: JobStore
    progress: Any  # worker.progress.ProgressReporter: progress.report(step, total, loss=, psnr=)
    checkpoints: (
        Any  # worker.checkpoints.CheckpointManager: due(), save(step, tensors, meta), load_latest()
    )
    device: Any  # torch.device chosen for this worker
    lease: Any = None  # core.leases.Claim held for this run (None: no lease, e.g. scripts)

    @cached_property
    def config(self) -> Config:
        """The job's config as its kind's model (worker.configs.job_config), validated once."""
        return job_config(self.job)

    @cached_property
    def _cancel_flag(self) -> CancelFlag:
        return CancelFlag(self.store, self.job.id)

    def cancelled(self) -> bool:
        return self._cancel_flag()

    def raise_if_cancelled(self) -> None:
        if self.lease is not None and self.lease.lost.is_set():
            raise LeaseLost()
        if STOP.is_set():
            raise JobInterrupted()
        if self.cancelled():
            raise JobCancelled()


def pick_device(preference: str | None = None):
    """The torch device for this worker: DEVICE setting if given, else cuda when present."""
    import torch

    from core.settings import get_settings

    preference = preference or get_settings().device
    if preference:
        return torch.device(preference)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
