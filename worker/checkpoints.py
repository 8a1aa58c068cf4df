"""Training checkpoints: step-<n>.safetensors + step-<n>.json, written atomically, with a
`latest` pointer switched by rename. Loading skips unreadable files and falls back to older ones."""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from core.storage import atomic_write_bytes, atomic_write_json

log = logging.getLogger(__name__)
STEP_RE = re.compile(r"^step-(\d+)\.safetensors$")


@dataclass
class Checkpoint:
    step: int
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    path: Path
    # Renderers stash what they build from the tensors (a model on a device) here; the
    # render task keeps recent Checkpoint objects in an LRU, so the cache lives as long.
    cache: dict[str, Any] = field(default_factory=dict)


class CheckpointManager:
    def __init__(self, directory: Path, keep: int = 3, interval_s: float = 30.0):
        self.dir = Path(directory)
        self.keep = keep
        self.interval_s = interval_s
        self._last_save = time.monotonic()

    # -- writing -----------------------------------------------------------------------
    def due(self) -> bool:
        return time.monotonic() - self._last_save >= self.interval_s

    def save(
        self, step: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any] | None = None
    ) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        blob = save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()})
        path = self.dir / f"step-{step}.safetensors"
        # Meta first: a tensor file whose meta is missing is treated as incomplete.
        atomic_write_json(self.dir / f"step-{step}.json", {"step": step, **(meta or {})})
        atomic_write_bytes(path, blob)
        atomic_write_bytes(self.dir / "latest", str(step).encode())
        self._last_save = time.monotonic()
        self._prune()
        return path

    def _prune(self) -> None:
        for step in self.steps()[self.keep :]:
            for suffix in (".safetensors", ".json"):
                (self.dir / f"step-{step}{suffix}").unlink(missing_ok=True)

    # -- reading -----------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Steps on disk, newest first."""
        if not self.dir.is_dir():
            return []
        return sorted(
            (int(m.group(1)) for p in self.dir.iterdir() if (m := STEP_RE.match(p.name))),
            reverse=True,
        )

    def latest_step(self) -> int | None:
        try:
            return int((self.dir / "latest").read_text().strip())
        except (FileNotFoundError, ValueError):
            steps = self.steps()
            return steps[0] if steps else None

    def load(self, step: int) -> Checkpoint:
        path = self.dir / f"step-{step}.safetensors"
        meta = json.loads((self.dir / f"step-{step}.json").read_text())
        return Checkpoint(step=step, tensors=load_file(str(path)), meta=meta, path=path)

    def load_latest(self) -> Checkpoint | None:
        """Newest readable checkpoint: the `latest` one first, then older steps."""
        first = self.latest_step()
        order = ([first] if first is not None else []) + [s for s in self.steps() if s != first]
        for step in order:
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
