"""Training checkpoints in the layout of core.storage (step-<n>.safetensors + step-<n>.json and
a `latest` pointer), written atomically. Loading skips unreadable files and falls back to older
ones."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from core.storage import (
    LATEST_NAME,
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


class CheckpointManager:
    def __init__(
        self,
        directory: Path,
        keep: int = 3,
        interval_s: float = 30.0,
        max_share: float = MAX_SHARE,
    ):
        self.dir = Path(directory)
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
        atomic_write_bytes(self.dir / LATEST_NAME, str(step).encode())
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
