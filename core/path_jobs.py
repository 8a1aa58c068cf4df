"""Render jobs: a camera path (kind path) or one large frame (kind frame) rendered by a render
worker in the background, for what would not finish within one HTTP wait. The API inserts the
row of the `renders` table (core/db/renders.py; queued, with the request, so a lost message can
be sent again) and sends the task; the worker then updates it (running with frames_done /
pixels_done, then succeeded or failed) under its lease (kind `render`, core/leases.py), and
stores the file as the job's artifact `<kind>-<id>.<extension>`.

Functions take the job's `JobPaths` (its folder's name is the job id) as they always have."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from core import leases
from core.db.engine import session
from core.db.leases import RENDER
from core.db.renders import RenderRow
from core.storage import JobPaths

FIELDS = (
    "id",
    "job_id",
    "kind",
    "status",
    "format",
    "n_frames",
    "frames_done",
    "n_pixels",
    "pixels_done",
    "checkpoint_step",
    "artifact",
    "error",
)
UPDATABLE = {"status", "frames_done", "pixels_done", "checkpoint_step", "artifact", "error"}


def new_id() -> str:
    return str(uuid.uuid4())


def parse_id(render_id: str) -> str:
    """Canonical UUID string; ValueError for anything else (ids never reach a path raw)."""
    return str(uuid.UUID(str(render_id)))


# A frame's format -> its file's extension (png16 is a 16-bit PNG).
EXTENSIONS = {"png16": "png", "jpeg": "jpg"}


def artifact_name(render_id: str, fmt: str, kind: str = "path") -> str:
    return f"{kind}-{render_id}.{EXTENSIONS.get(fmt, fmt)}"


def _settings(settings):
    if settings is None:
        from core.settings import get_settings

        return get_settings()
    return settings


def _job_id(paths: JobPaths | str) -> str:
    return paths if isinstance(paths, str) else paths.root.name


def state(row: RenderRow) -> dict[str, Any]:
    """The row as the API shows it (api_schemas.render.PathJob's fields but the urls)."""
    out = {name: getattr(row, name) for name in FIELDS}
    out["created_at"] = row.created_at.isoformat()
    out["updated_at"] = row.updated_at.isoformat()
    return out


def create(
    paths: JobPaths | str,
    render_id: str,
    job_id: str,
    fmt: str,
    n_frames: int,
    kind: str = "path",
    n_pixels: int | None = None,
    request: dict[str, Any] | None = None,
    settings=None,
) -> dict[str, Any]:
    """Insert a queued render job; `request` (the task's request, as JSON) lets the reaper send
    it again should its message be lost."""
    now = datetime.now(UTC)
    row = RenderRow(
        id=parse_id(render_id),
        job_id=job_id,
        kind=kind,
        status="queued",
        format=fmt,
        n_frames=n_frames,
        frames_done=0,
        n_pixels=n_pixels,
        pixels_done=None if n_pixels is None else 0,
        request=request,
        created_at=now,
        updated_at=now,
    )
    with session(_settings(settings)) as s:
        s.add(row)
        s.flush()
        return state(row)


def _row(s, paths: JobPaths | str, render_id: str, lock: bool = False) -> RenderRow:
    q = select(RenderRow).where(
        RenderRow.id == parse_id(render_id), RenderRow.job_id == _job_id(paths)
    )
    row = s.execute(q.with_for_update() if lock else q).scalar_one_or_none()
    if row is None:
        raise FileNotFoundError(f"no render job {render_id}")
    return row


def read(paths: JobPaths | str, render_id: str, settings=None) -> dict[str, Any]:
    """The state; FileNotFoundError when the job has no such render job, ValueError for a bad
    id."""
    with session(_settings(settings)) as s:
        return state(_row(s, paths, render_id))


def request_of(paths: JobPaths | str, render_id: str, settings=None) -> dict[str, Any] | None:
    with session(_settings(settings)) as s:
        return _row(s, paths, render_id).request


def update(
    paths: JobPaths | str,
    render_id: str,
    settings=None,
    fence: leases.Claim | None = None,
    **changes: Any,
) -> dict[str, Any]:
    """Set `changes`; with `fence` (the worker's claim of the render job's lease) only while
    that lease is still the claim's holder's, checked in the same transaction (LeaseLost
    otherwise, nothing written), transient database errors retried until it is lost."""
    unknown = set(changes) - UPDATABLE
    if unknown:
        raise ValueError(f"render job fields that cannot be set: {sorted(unknown)}")
    if fence is None:
        return _update(paths, render_id, settings, changes, None)
    return leases.fenced(
        fence,
        lambda: _update(paths, render_id, settings, changes, fence),
        f"writing render {render_id}",
    )


def _update(paths, render_id: str, settings, changes: dict[str, Any], fence) -> dict[str, Any]:
    with session(_settings(settings), write=True) as s:
        row = _row(s, paths, render_id, lock=True)
        leases.fence(s, fence)
        for name, value in changes.items():
            setattr(row, name, value)
        row.updated_at = datetime.now(UTC)
        return state(row)


@contextmanager
def running(paths: JobPaths | str, render_id: str, settings=None) -> Iterator[Any]:
    """The render job's lease, held and renewed while a worker renders it: yields the claim
    (with the worker losses so far), or None when another live worker renders it."""
    settings = _settings(settings)
    job_id = _job_id(paths)
    with leases.held(
        settings, RENDER, parse_id(render_id), settings.lease_ttl_s, job_id=job_id
    ) as claim:
        yield claim
