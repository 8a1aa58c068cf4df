"""`GET /v1/jobs/{id}/events`: Server-Sent Events tailed from the job's events.jsonl.

The file is the source of truth (the JobStore appends to it under the job lock), so any
number of API processes can serve streams and a reconnect replays from any id. job.json is
read alongside only to learn when the job has ended and to fill gaps: a producer that goes
quiet for a second still yields a progress event, so clients can rely on the cadence.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query
from sse_starlette import EventSourceResponse, ServerSentEvent

from core.storage import JobPaths, LocalStorage
from service.api.deps import JOB_GUARDS, get_storage, job_id_param

log = logging.getLogger(__name__)

router = APIRouter(tags=["events"], dependencies=JOB_GUARDS)

TERMINAL = {"succeeded", "failed", "cancelled"}
POLL_S = 0.2
# Longest silence while running before a progress event is re-sent from job.json.
PROGRESS_EVERY_S = 1.0
# job.json is written just before its status event is appended (same lock), so a terminal
# job.json without the matching event means that append is a moment away, or never came.
TERMINAL_GRACE_S = 2.0


class EventFileTail:
    """Reads complete JSON lines appended since the last call; a half-written line waits."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.pending = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                if size < self.offset:  # replaced by a shorter file: start over, ids dedupe
                    self.offset, self.pending = 0, b""
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
                int(ev["id"]), str(ev["event"])
            except (ValueError, KeyError, TypeError):
                log.warning("skipping malformed event line in %s", self.path)
                continue
            out.append(ev)
        return out


def _read_job(paths: JobPaths) -> dict[str, Any] | None:
    try:
        return json.loads(paths.job_json.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ValueError:
        return {}  # never expected (atomic writes); treat as "unknown, look again"


def _sse(event: str, data: Any, event_id: int | None = None) -> ServerSentEvent:
    return ServerSentEvent(
        data=json.dumps(data, default=str),
        event=event,
        id=str(event_id) if event_id is not None else None,
    )


async def job_events(
    paths: JobPaths, after: int | None, poll_s: float = POLL_S
) -> AsyncIterator[ServerSentEvent]:
    """Events with id > `after`, then live ones, then one `end` event with the final job.

    A client that goes away is noticed by EventSourceResponse, which cancels this generator.
    """
    tail = EventFileTail(paths.events)
    last_sent = after if after is not None else 0
    stream_status: str | None = None  # latest status according to the event file
    last_emit = time.monotonic()
    terminal_seen_at: float | None = None
    first_pass = True

    while True:
        for ev in tail.read_new():
            ev_id = int(ev["id"])
            if ev["event"] == "status" and isinstance(ev.get("data"), dict):
                stream_status = ev["data"].get("status", stream_status)
            if ev_id <= last_sent:
                continue
            last_sent = ev_id
            last_emit = time.monotonic()
            yield _sse(ev["event"], ev.get("data"), ev_id)

        job = _read_job(paths)
        if job is None:  # job folder removed while streaming
            yield _sse("end", {"id": paths.root.name, "status": "deleted"})
            return
        status = job.get("status")
        if first_pass and stream_status is None and status:
            # Nothing in the file yet (job made by an older writer): say where it stands.
            yield _sse(
                "status",
                {"status": status, "error": job.get("error"), "metrics": job.get("metrics", {})},
            )
            stream_status = status
            last_emit = time.monotonic()
        first_pass = False

        if status in TERMINAL:
            now = time.monotonic()
            terminal_seen_at = terminal_seen_at or now
            if stream_status == status or now - terminal_seen_at >= TERMINAL_GRACE_S:
                if stream_status != status:
                    yield _sse(
                        "status",
                        {
                            "status": status,
                            "error": job.get("error"),
                            "metrics": job.get("metrics", {}),
                        },
                    )
                yield _sse("end", job)
                return
        elif status == "running" and time.monotonic() - last_emit >= PROGRESS_EVERY_S:
            # No id: a repeat of the latest known progress must not move Last-Event-ID.
            yield _sse("progress", job.get("progress") or {})
            last_emit = time.monotonic()

        await asyncio.sleep(poll_s)


def _parse_last_event_id(raw: str | None) -> int | None:
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise HTTPException(
            422, detail=f"Last-Event-ID must be an integer event id, got {raw!r}"
        ) from None
    if value < 0:
        raise HTTPException(422, detail="Last-Event-ID must not be negative")
    return value


@router.get(
    "/v1/jobs/{job_id}/events",
    summary="Live job events (Server-Sent Events)",
    response_class=EventSourceResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`progress` and `status` events with ids, then one `end` "
            "event carrying the final job; the stream then closes.",
        },
        404: {"description": "unknown job"},
    },
)
async def stream_job_events(
    job_id: str,
    storage: LocalStorage = Depends(get_storage),
    last_event_id_header: str | None = Header(None, alias="Last-Event-ID"),
    last_event_id: str | None = Query(
        None, description="same as the Last-Event-ID header (for clients that cannot set headers)"
    ),
):
    paths = storage.paths(job_id_param(job_id))
    after = _parse_last_event_id(
        last_event_id_header if last_event_id_header is not None else last_event_id
    )
    if not paths.job_json.is_file():
        raise HTTPException(404, detail=f"job {job_id} not found")
    # ping keeps proxies from closing the stream while a job waits in the queue;
    # send_timeout drops a client that stopped reading instead of holding its task forever.
    return EventSourceResponse(
        job_events(paths, after),
        ping=10,
        send_timeout=30,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
