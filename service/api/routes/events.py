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
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

import anyio
from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from core.storage import JobPaths, LocalStorage
from service.api.deps import JOB_GUARDS, get_storage, job_id_param
from service.auth import ApiKey
from service.ratelimit import STREAM_LEASE_S, StreamSlots

log = logging.getLogger(__name__)

router = APIRouter(tags=["events"], dependencies=JOB_GUARDS)

TERMINAL = {"succeeded", "failed", "cancelled"}
POLL_S = 0.2
# Longest silence while running before a progress event is re-sent from job.json.
PROGRESS_EVERY_S = 1.0
# job.json is written just before its status event is appended (same lock), so a terminal
# job.json without the matching event means that append is a moment away, or never came.
TERMINAL_GRACE_S = 2.0


MAX_READ = 1 << 20  # bytes one read takes from the file (a long history comes in pieces)


def _line_id(line: bytes) -> int | None:
    try:
        return int(json.loads(line)["id"])
    except (ValueError, KeyError, TypeError):
        return None


def offset_after(fh: BinaryIO, after: int) -> int:
    """Byte offset of the first line whose id is > `after`, by bisection over the file (ids
    grow line by line), so a replay reads O(log n) lines, not the history. A line that does
    not parse counts as "maybe later", which can only start the replay earlier (the stream
    skips ids already sent)."""
    size = fh.seek(0, os.SEEK_END)

    def line_start(pos: int) -> int:
        if pos == 0:
            return 0
        fh.seek(pos - 1)
        fh.readline()
        return fh.tell()

    def later(pos: int) -> bool:
        start = line_start(pos)
        if start >= size:
            return True
        fh.seek(start)
        found = _line_id(fh.readline())
        return found is None or found > after

    lo, hi = 0, size
    while lo < hi:
        mid = (lo + hi) // 2
        if later(mid):
            hi = mid
        else:
            lo = mid + 1
    return line_start(lo)


class EventFileTail:
    """Reads complete JSON lines appended since the last call; a half-written line waits."""

    def __init__(self, path: Path, after: int | None = None):
        self.path = path
        self.offset = 0
        self.pending = b""
        self.after = after
        self.more = False

    def _start(self, fh) -> None:
        if self.after:
            self.offset = offset_after(fh, self.after)
        self.after = None

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                if self.after is not None:
                    self._start(fh)
                if size < self.offset:  # replaced by a shorter file: start over, ids dedupe
                    self.offset, self.pending = 0, b""
                fh.seek(self.offset)
                chunk = fh.read(MAX_READ)
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        self.more = len(chunk) == MAX_READ
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
    tail = EventFileTail(paths.events, after)
    last_sent = after if after is not None else 0
    stream_status: str | None = None  # latest status according to the event file
    last_emit = time.monotonic()
    terminal_seen_at: float | None = None
    first_pass = True

    while True:
        # File reads run on a thread: a slow disk must not stall the event loop.
        for ev in await asyncio.to_thread(tail.read_new):
            ev_id = int(ev["id"])
            if ev["event"] == "status" and isinstance(ev.get("data"), dict):
                stream_status = ev["data"].get("status", stream_status)
            if ev_id <= last_sent:
                continue
            last_sent = ev_id
            last_emit = time.monotonic()
            yield _sse(ev["event"], ev.get("data"), ev_id)
        if tail.more:
            continue  # the rest of a long history first

        job = await asyncio.to_thread(_read_job, paths)
        if job is None:  # job folder removed while streaming
            yield _sse("end", {"id": paths.root.name, "status": "deleted"})
            return
        status = job.get("status")
        if first_pass and stream_status is None and status and after:
            # A replay starts past the status events up to `after`, which the client has seen;
            # every later one was just read. (job.json is written just before its status event
            # is appended: in that instant the event is missed, and `end` still carries it.)
            stream_status = status
        elif first_pass and stream_status is None and status:
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
        429: {"description": "MAX_STREAMS_PER_KEY streams already open for this key"},
    },
)
async def stream_job_events(
    request: Request,
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
    key: ApiKey = request.state.api_key
    # Shared through Redis when REDIS_URL is set: the cap holds across API replicas.
    slots: StreamSlots = request.app.state.stream_slots
    slot = await slots.acquire(key.id)
    if slot is None:
        raise HTTPException(
            429,
            f"this API key has {await slots.count(key.id)} event streams open, the limit is "
            f"{slots.cap} (MAX_STREAMS_PER_KEY)",
            headers={"Retry-After": "5"},
        )

    async def keep(slot: str) -> None:
        while True:
            await asyncio.sleep(STREAM_LEASE_S / 3)
            await slots.refresh(key.id, slot)

    async def counted() -> AsyncIterator[ServerSentEvent]:
        lease = asyncio.create_task(keep(slot))
        try:
            async for ev in job_events(paths, after):
                yield ev
        finally:
            lease.cancel()
            with anyio.CancelScope(shield=True):  # a disconnect cancels; the slot still goes back
                await slots.release(key.id, slot)

    # ping keeps proxies from closing the stream while a job waits in the queue;
    # send_timeout drops a client that stopped reading instead of holding its task forever.
    return EventSourceResponse(
        counted(),
        ping=10,
        send_timeout=30,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
