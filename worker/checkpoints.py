"""Training checkpoints in the layout of core.storage (step-<n>.safetensors + step-<n>.json and
a `latest` pointer), written atomically. Loading skips unreadable files and falls back to older
ones.

With object storage the folder is a working copy: a manager given a `Published` uploads each
checkpoint after writing it (tensors and meta first, the pointer last, so a reader that follows
the pointer finds a complete checkpoint), and `Published.pull_latest` brings the newest one into
a worker's working copy to resume or render from.

A training's manager is given `confirm` (worker/tasks.py: a fenced no-op on the job's row,
core.store's `confirm`): the pointer to a new checkpoint, local or published, is written only
once the database has said, just before, that this worker still holds the job's lease, and so
are the deletions of older published steps. The checkpoint's own files have names of their step
and are never a pointer."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from core import retry
from core.storage import (
    CHECKPOINT_RE,
    LATEST_NAME,
    Storage,
    atomic_write_bytes,
    atomic_write_json,
    checkpoint_meta,
    checkpoint_order,
    checkpoint_steps,
    checkpoint_tensors,
    latest_checkpoint_step,
)

log = logging.getLogger(__name__)


@dataclass
class Checkpoint:
    step: int
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    path: Path
    # Renderers stash what they build from the tensors (a model on a device) here; the
    # render task keeps recent Checkpoint objects in an LRU, so the cache lives as long.
    cache: dict[str, Any] = field(default_factory=dict)


# The most of the wall time between two checkpoints that writing one may take: a large table
# with its optimiser state (2^19 rows x 16 levels and two Adam moments: ~200 MB) is written
# less often than CHECKPOINT_INTERVAL_S asks when one write takes longer than that allows.
MAX_SHARE = 0.03


class Published:
    """A job's checkpoints in storage: the objects `<prefix>/step-<n>.{json,safetensors}` and
    `<prefix>/latest`, mirrored from the `<prefix>` folder of the job's work dir."""

    def __init__(self, storage: Storage, job_id: str, prefix: str = "checkpoints"):
        self.storage = storage
        self.job_id = job_id
        self.prefix = prefix

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def publish(self, step: int, keep: int, confirm: Callable[[], None] | None = None) -> None:
        """Upload the work dir's checkpoint `step`, then (once `confirm()` returned: it raises
        when the lease is lost) the pointer to it, then delete all but the `keep` newest
        published steps (never `step`)."""
        for path in (checkpoint_meta(Path(), step), checkpoint_tensors(Path(), step)):
            self._push(path.name)
        if confirm is not None:
            confirm()
        self._push(LATEST_NAME)
        try:
            for old in self.steps()[max(keep, 1) :]:
                if old != step:
                    for path in (checkpoint_tensors(Path(), old), checkpoint_meta(Path(), old)):
                        self.storage.delete(self.job_id, self._key(path.name))
        except Exception as exc:  # old steps left: the next publish prunes them
            if not retry.transient(exc):
                raise
            log.warning("job %s: old checkpoints not pruned (%s)", self.job_id, type(exc).__name__)

    def _push(self, name: str) -> None:
        """Upload one file of the work dir's folder, through transient storage errors (an
        endpoint down for a while, 5xx, SlowDown: core/retry.py) with backoff."""
        retry.retrying(
            lambda: self.storage.push(self.job_id, self._key(name)),
            f"uploading {self.prefix}/{name} of job {self.job_id}",
        )

    def steps(self) -> list[int]:
        """Published steps (those with a tensor object), newest first."""
        names = (
            info.key.rsplit("/", 1)[-1]
            for info in self.storage.list(self.job_id, f"{self.prefix}/")
        )
        return sorted(
            (int(m.group(1)) for n in names if (m := CHECKPOINT_RE.match(n))), reverse=True
        )

    def latest_step(self) -> int | None:
        """The step the published pointer names; None before the first complete checkpoint."""
        try:
            return int(self.storage.get_bytes(self.job_id, self._key(LATEST_NAME)).strip())
        except (FileNotFoundError, ValueError):
            return None

    def pull_latest(self, folder: Path, step: int | None = None) -> int | None:
        """Download published checkpoint `step` (default: the pointer's) into `folder`, the
        work dir's `<prefix>` folder, and point the folder's `latest` at it. Returns the step,
        None when nothing is published."""
        step = self.latest_step() if step is None else step
        if step is None:
            return None
        # the dot: step-1. must not match step-10; pull moves only what is missing or changed
        self.storage.pull(self.job_id, self._key(f"step-{step}."))
        atomic_write_bytes(Path(folder) / LATEST_NAME, str(step).encode())
        return step


class CheckpointManager:
    def __init__(
        self,
        directory: Path,
        keep: int = 3,
        interval_s: float = 30.0,
        max_share: float = MAX_SHARE,
        published: Published | None = None,
        confirm: Callable[[], None] | None = None,
    ):
        self.dir = Path(directory)
        self.confirm = confirm  # raises (LeaseLost) unless the job's lease is still ours
        self.published = published  # None: the folder is the only copy (local storage)
        self.keep = keep
        self.interval_s = interval_s
        self.max_share = max_share
        self._last_save = time.monotonic()
        self.saved_step: int | None = None  # the newest step this manager wrote
        self.last_cost_s = 0.0  # seconds the latest save took
        self.spent_s = 0.0  # seconds all saves of this manager took

    # -- writing -----------------------------------------------------------------------
    def due(self, marked: bool = False) -> bool:
        """Time for a checkpoint: `interval_s` passed since the last one (or the caller's own
        schedule `marked` this step), and the last save's cost stays within `max_share` of the
        time since it."""
        since = time.monotonic() - self._last_save
        if since * self.max_share < self.last_cost_s:
            return False
        return marked or since >= self.interval_s

    def save(
        self, step: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any] | None = None
    ) -> Path:
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        blob = save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()})
        path = checkpoint_tensors(self.dir, step)
        # Meta first: a tensor file whose meta is missing is treated as incomplete.
        atomic_write_json(checkpoint_meta(self.dir, step), {"step": step, **(meta or {})})
        atomic_write_bytes(path, blob)
        if self.published is None and self.confirm is not None:
            self.confirm()  # the folder is the only copy: its pointer is the job's
        atomic_write_bytes(self.dir / LATEST_NAME, str(step).encode())
        if self.published is not None:
            self.published.publish(step, self.keep, self.confirm)
        self.saved_step = step
        self._prune()
        self._last_save = time.monotonic()
        self.last_cost_s = self._last_save - t0
        self.spent_s += self.last_cost_s
        return path

    def _prune(self) -> None:
        for step in self.steps()[self.keep :]:
            checkpoint_tensors(self.dir, step).unlink(missing_ok=True)
            checkpoint_meta(self.dir, step).unlink(missing_ok=True)

    # -- reading -----------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Steps on disk, newest first."""
        return checkpoint_steps(self.dir)

    def latest_step(self) -> int | None:
        return latest_checkpoint_step(self.dir)

    def load(self, step: int) -> Checkpoint:
        path = checkpoint_tensors(self.dir, step)
        meta = json.loads(checkpoint_meta(self.dir, step).read_text())
        return Checkpoint(step=step, tensors=load_file(str(path)), meta=meta, path=path)

    def load_latest(self) -> Checkpoint | None:
        """Newest readable checkpoint: the `latest` one first, then older steps."""
        for step in checkpoint_order(self.dir):
            try:
                return self.load(step)
            except Exception as exc:  # truncated/corrupt file: fall back to the previous one
                log.warning(
                    "checkpoint step %s in %s unreadable (%s); trying an older one",
                    step,
                    self.dir,
                    exc,
                )
        return None
