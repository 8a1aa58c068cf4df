"""Render jobs: a camera path (kind path) or one large frame (kind frame) rendered by a render
worker in the background, for what would not finish within one HTTP wait. The API writes
`<job>/renders/<id>.json` (queued) and sends the task; the worker alone then rewrites it
(atomically: running with frames_done / pixels_done, then succeeded or failed), and stores the
file as the job's artifact `<kind>-<id>.<extension>`."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.storage import JobPaths, atomic_write_json


def new_id() -> str:
    return str(uuid.uuid4())


def parse_id(render_id: str) -> str:
    """Canonical UUID string; ValueError for anything else (ids never reach a path raw)."""
    return str(uuid.UUID(str(render_id)))


# A frame's format -> its file's extension (png16 is a 16-bit PNG).
EXTENSIONS = {"png16": "png", "jpeg": "jpg"}


def artifact_name(render_id: str, fmt: str, kind: str = "path") -> str:
    return f"{kind}-{render_id}.{EXTENSIONS.get(fmt, fmt)}"


def state_file(paths: JobPaths, render_id: str) -> Path:
    return paths.renders / f"{parse_id(render_id)}.json"


def _now() -> str:
    return datetime.now(UTC).isoformat()


def create(
    paths: JobPaths,
    render_id: str,
    job_id: str,
    fmt: str,
    n_frames: int,
    kind: str = "path",
    n_pixels: int | None = None,
) -> dict[str, Any]:
    state = {
        "id": render_id,
        "job_id": job_id,
        "kind": kind,
        "status": "queued",
        "format": fmt,
        "n_frames": n_frames,
        "frames_done": 0,
        "n_pixels": n_pixels,
        "pixels_done": None if n_pixels is None else 0,
        "checkpoint_step": None,
        "artifact": None,
        "error": None,
        "created_at": _now(),
        "updated_at": _now(),
    }
    atomic_write_json(state_file(paths, render_id), state)
    return state


def read(paths: JobPaths, render_id: str) -> dict[str, Any]:
    """The state; FileNotFoundError when there is no such path job, ValueError for a bad id."""
    return json.loads(state_file(paths, render_id).read_text())


def update(paths: JobPaths, render_id: str, **changes: Any) -> dict[str, Any]:
    state = {**read(paths, render_id), **changes, "updated_at": _now()}
    atomic_write_json(state_file(paths, render_id), state)
    return state
