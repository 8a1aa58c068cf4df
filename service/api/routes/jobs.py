"""Job submission, listing, status and cancel."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool

from api_schemas.jobs import Job, JobKind, JobList, JobStatus
from core.metrics import quota_refused
from core.store import BadCursor, JobNotFound, encode_cursor
from service.api.deps import (
    GUARDS,
    OWNER,
    KeyDep,
    QueueDep,
    SettingsDep,
    StorageDep,
    StoreDep,
    job_id_param,
    load_job,
)
from service.api.job_intake import check_budget, discard, finish_intake, parse_config, safe_name
from service.api.multipart import boundary_of, read_form
from service.intake import IntakeError
from service.intake.registry import KINDS, available_kinds, get_kind
from service.quotas import QuotaExceeded
from service.webhooks import admit_callback

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=GUARDS)


UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["kind", "dataset"],
                    "properties": {
                        "kind": {"type": "string", "enum": list(KINDS), "description": "job kind"},
                        "dataset": {
                            "type": "string",
                            "format": "binary",
                            "description": "image: a PNG or JPEG; nerf, splat: an archive of posed "
                            "or plain photos, or a video (mp4, mov, webm)",
                        },
                        "config": {
                            "type": "string",
                            "description": "JSON object; omitted keys take defaults",
                        },
                        "callback_url": {
                            "type": "string",
                            "description": "http(s) URL that gets the job's signed webhook "
                            "events (docs/webhooks.md); default: the key's (PUT /v1/webhook)",
                        },
                    },
                }
            }
        },
    }
}


@router.post(
    "",
    status_code=202,
    response_model=Job,
    summary="Upload a dataset and start training",
    openapi_extra=UPLOAD_BODY,
    responses={
        413: {
            "description": "over MAX_UPLOAD_MB, or over the disk left under the key's "
            "QUOTA_STORED_MB"
        },
        429: {
            "description": "QUOTA_ACTIVE_JOBS or QUOTA_JOBS_PER_HOUR reached (Retry-After says when)"
        },
        415: {"description": "not a supported file"},
        409: {"description": "a callback_url, but the key has no webhook secret yet"},
        422: {"description": "unknown kind, bad config or bad file"},
    },
)
async def create_job(
    request: Request,
    settings: SettingsDep,
    storage: StorageDep,
    store: StoreDep,
    queue: QueueDep,
    key: KeyDep,
) -> Job:
    try:
        boundary_of(request)
    except IntakeError as exc:
        raise HTTPException(exc.status_code, exc.detail) from None
    try:
        # Quotas are checked, and the job folder reserved, before the upload is read.
        job_id, paths, room = await run_in_threadpool(request.app.state.quotas.admit, key)
    except QuotaExceeded as exc:
        if exc.status_code in (413, 429):  # not a queue outage
            quota_refused(exc.detail)
        raise HTTPException(exc.status_code, exc.detail, headers=exc.headers) from None
    limit, limit_name = settings.max_upload_bytes, "MAX_UPLOAD_MB"
    if room < limit:
        limit, limit_name = room, "the disk left to this API key under QUOTA_STORED_MB"
    try:
        work = storage.work_dir(job_id)
        work.upload.mkdir(parents=True)
        # However slowly the body comes, its reserved row stays fresh: the reaper removes only
        # reservations nobody touched for STALE_UPLOAD_S (admission just wrote this one).
        with store.keep_reserved(job_id, settings.stale_upload_s, touch_first=False):
            form = await read_form(
                request, lambda _field, name: work.upload / safe_name(name), limit, limit_name
            )
        kind = form.fields.get("kind")
        if not kind:
            raise IntakeError(422, "form field `kind` is required")
        spec = get_kind(kind)
        if spec is None:
            raise IntakeError(
                422, f"unknown kind {kind!r}; available: {', '.join(available_kinds()) or 'none'}"
            )
        cfg = parse_config(spec, form.fields.get("config"))
        check_budget(cfg, settings)
        callback = (form.fields.get("callback_url") or "").strip()
        if callback:
            await run_in_threadpool(admit_callback, callback, key, paths, storage, settings)
        upload = next((f for f in form.files if f.field == "dataset"), None)
        if upload is None:
            raise IntakeError(422, "form field `dataset` (a file) is required")
        job = await run_in_threadpool(
            finish_intake, spec, cfg, upload, job_id, work, storage, store, settings
        )
        # What the job stores, charged under the key's lock: parallel uploads share the room.
        await run_in_threadpool(request.app.state.quotas.charge, key, job_id)
    except IntakeError as exc:
        discard(store, storage, job_id)
        raise HTTPException(exc.status_code, exc.detail) from None
    except QuotaExceeded as exc:
        discard(store, storage, job_id)
        quota_refused(exc.detail)
        raise HTTPException(exc.status_code, exc.detail) from None
    except BaseException:
        discard(store, storage, job_id)
        raise
    try:
        await run_in_threadpool(queue.send_first, job)
    except Exception as exc:
        log.exception("could not enqueue job %s", job_id)
        discard(store, storage, job_id)
        raise HTTPException(503, f"the job queue is unavailable ({type(exc).__name__})") from None
    return job


@router.get("", response_model=JobList, summary="List jobs, newest first")
def list_jobs(
    store: StoreDep,
    key: KeyDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, description="skip this many (use `cursor` instead)")] = 0,
    cursor: Annotated[
        str | None,
        Query(max_length=200, description="`next_cursor` of the previous page"),
    ] = None,
    status: JobStatus | None = None,
    kind: JobKind | None = None,
) -> JobList:
    # The key's own jobs through the (owner, created_at, id) index: other keys' are never read.
    cursor = cursor or None  # `?cursor=` (empty): the first page
    try:
        jobs, total = store.list(
            limit=limit + 1,
            offset=0 if cursor else offset,
            status=status,
            kind=kind,
            owner=key.id,
            cursor=cursor,
        )
    except BadCursor as exc:
        raise HTTPException(422, str(exc)) from None
    page = jobs[:limit]
    more = len(jobs) > limit
    return JobList(
        items=page,
        total=total,
        limit=limit,
        offset=0 if cursor else offset,
        next_cursor=encode_cursor(page[-1]) if more else None,
    )


@router.get(
    "/{job_id}",
    response_model=Job,
    summary="Job status, progress and metrics",
    dependencies=OWNER,
)
def get_job(job_id: str, store: StoreDep) -> Job:
    return load_job(store, job_id)


@router.post(
    "/{job_id}/cancel",
    dependencies=OWNER,
    response_model=Job,
    summary="Cancel a queued or running job",
    responses={409: {"description": "the job has already ended"}},
)
def cancel_job(job_id: str, store: StoreDep, storage: StorageDep, queue: QueueDep) -> Job:
    job = load_job(store, job_id)
    if job.status.terminal:
        raise HTTPException(409, f"job is already {job.status.value}")
    # The flag reaches a running trainer (it polls it) and a worker that picks the task up
    # right now; a still-queued job is cancelled on the spot.
    try:
        job = store.request_cancel(job.id)
    except JobNotFound:
        raise HTTPException(404, f"job {job_id} not found") from None
    if job.status == JobStatus.cancelled:
        queue.revoke(job.id)
    return job


@router.delete(
    "/{job_id}",
    dependencies=OWNER,
    status_code=204,
    summary="Delete a finished job and its files",
    responses={409: {"description": "the job is still queued or running"}},
)
def delete_job(job_id: str, store: StoreDep, storage: StorageDep):
    job = load_job(store, job_id)
    if not job.status.terminal:
        raise HTTPException(409, f"job is {job.status.value}; cancel it first")
    store.delete(job.id)
    storage.delete_job(job.id)
    return None


__all__ = ["router", "job_id_param"]
