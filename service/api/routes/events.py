"""`GET /v1/jobs/{id}/events`: Server-Sent Events read from the job_events table.

The table is the source of truth (core/store.py inserts each event in the transaction that
changes the job, numbered by a per-job seq), so any number of API processes can serve streams
and a reconnect replays from any id. Events and the job are read in one transaction: a terminal
job's status event is always among the events read or before them, so `end` follows it at once.
Streams sleep between reads until the database says the job changed (core/db/notify.py:
PostgreSQL LISTEN/NOTIFY, or on SQLite one poll of the followed jobs per API process). A
producer that goes quiet for a second still yields a progress event, so clients can rely on the
cadence.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from sse_starlette import EventSourceResponse, ServerSentEvent

from api_schemas.jobs import JobStatus
from core.db.notify import EventWaker
from core.store import JobStore
from service.api.deps import JOB_GUARDS, StoreDep, job_id_param
from service.auth import ApiKey
from service.ratelimit import STREAM_LEASE_S, StreamSlots

log = logging.getLogger(__name__)

router = APIRouter(tags=["events"], dependencies=JOB_GUARDS)

POLL_S = 0.2  # re-read period with a waker that does not notify
# Re-read period with notifications: only a safety net (a notification lost in a reconnect).
IDLE_S = 5.0
# Longest silence while running before a progress event is re-sent from the job.
PROGRESS_EVERY_S = 1.0
BATCH = 1000  # events one read takes (a long history comes in pieces)


def _sse(event: str, data: Any, event_id: int | None = None) -> ServerSentEvent:
    return ServerSentEvent(
        data=json.dumps(data, default=str),
        event=event,
        id=str(event_id) if event_id is not None else None,
    )


async def job_events(
    store: JobStore, job_id: str, after: int | None, waker: EventWaker, poll_s: float = POLL_S
) -> AsyncIterator[ServerSentEvent]:
    """Events with id > `after`, then live ones, then one `end` event with the final job.

    A client that goes away is noticed by EventSourceResponse, which cancels this generator.
    """
    last_sent = after or 0
    last_emit = time.monotonic()
    async with waker.subscribe(job_id) as sub:
        while True:
            sub.clear()
            # Database reads run on a thread: a slow query must not stall the event loop.
            events, job = await asyncio.to_thread(store.poll, job_id, last_sent, BATCH)
            if job is None:  # deleted while streaming
                yield _sse("end", {"id": job_id, "status": "deleted"})
                return
            for ev in events:
                last_sent = ev["id"]
                last_emit = time.monotonic()
                yield _sse(ev["event"], ev["data"], ev["id"])
            if len(events) == BATCH:
                continue  # the rest of a long history first
            if job.status.terminal:
                yield _sse("end", job.model_dump(mode="json"))
                return
            running = job.status == JobStatus.running
            if running and time.monotonic() - last_emit >= PROGRESS_EVERY_S:
                # No id: a repeat of the latest known progress must not move Last-Event-ID.
                yield _sse("progress", job.progress.model_dump(mode="json"))
                last_emit = time.monotonic()
            if waker.notifying:
                wait = PROGRESS_EVERY_S if running else IDLE_S
            else:
                wait = poll_s
            await sub.wait(wait)


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
    store: StoreDep,
    last_event_id_header: str | None = Header(None, alias="Last-Event-ID"),
    last_event_id: str | None = Query(
        None, description="same as the Last-Event-ID header (for clients that cannot set headers)"
    ),
):
    job_id = job_id_param(job_id)
    after = _parse_last_event_id(
        last_event_id_header if last_event_id_header is not None else last_event_id
    )
    if not await run_in_threadpool(store.exists, job_id):
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
            async for ev in job_events(store, job_id, after, request.app.state.event_waker):
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
