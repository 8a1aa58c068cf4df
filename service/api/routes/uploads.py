"""Direct uploads (api_schemas/uploads.py): a dataset PUT in parts straight to the object store,
then completed into a job. Only where job files live in object storage (STORAGE_URL=s3://...);
the multipart `POST /v1/jobs` works everywhere.

Starting one is an admission like `POST /v1/jobs` (quotas checked, the job id reserved; the file's
announced size must fit MAX_UPLOAD_MB and the key's room). Its state is an object next to the
upload (`upload/.direct.json`), so any API replica can complete it. Completing assembles the
parts, then the API fetches the file and checks it in the same limited child process as any upload;
the raw upload object is removed once its dataset is stored. Two completes of one upload at once
are told apart within one API process only (the second answers 409); on two replicas at the
same moment both may run and the job may be discarded, so clients wait for a complete's answer
before sending another (a later one answers 404). An upload neither completed nor
cancelled lapses with its reservation after STALE_UPLOAD_S (the reaper removes it and its parts);
its part URLs lapse after half of that, so an upload whose last part went in while they were valid
has STALE_UPLOAD_S / 2 or more to be completed. A complete first touches the reservation (410 when
the reaper removed it) and keeps it fresh until the job is made from it.
"""

from __future__ import annotations

import json
import logging
import math
import threading

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool

from api_schemas.jobs import Job
from api_schemas.uploads import Upload, UploadRequest
from core.metrics import quota_refused
from core.settings import Settings
from core.storage import Storage
from core.store import JobStore, ReservationGone
from service.api.deps import (
    GUARDS,
    OWNER,
    KeyDep,
    QueueDep,
    SettingsDep,
    StorageDep,
    StoreDep,
    job_id_param,
)
from service.api.job_intake import (
    check_budget,
    discard,
    finish_intake,
    parse_config,
    reservation_gone,
    safe_name,
)
from service.api.multipart import UploadedFile
from service.auth import ApiKey
from service.intake import IntakeError
from service.intake.registry import available_kinds, get_kind
from service.queue import TaskQueue
from service.quotas import QuotaExceeded
from service.webhooks import admit_callback

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/uploads", tags=["jobs"], dependencies=GUARDS)
STATE_KEY = "upload/.direct.json"
# Uploads being completed by this process: a second complete of one (a retried click) is
# answered 409 instead of racing the first through the intake.
_completing: set[str] = set()
_completing_lock = threading.Lock()


def _no_upload(job_id: str) -> HTTPException:
    return HTTPException(404, f"no upload {job_id} in progress")


@router.post(
    "",
    status_code=201,
    response_model=Upload,
    summary="Start a direct upload: the file goes in parts straight to object storage",
    responses={
        409: {
            "description": "job files are not in object storage (use POST /v1/jobs), or a "
            "callback_url without the key's webhook secret"
        },
        413: {"description": "over MAX_UPLOAD_MB, or over the room left under QUOTA_STORED_MB"},
        422: {"description": "unknown kind or bad config"},
        429: {"description": "QUOTA_ACTIVE_JOBS or QUOTA_JOBS_PER_HOUR reached"},
    },
)
async def start_upload(
    req: UploadRequest,
    request: Request,
    settings: SettingsDep,
    storage: StorageDep,
    store: StoreDep,
    key: KeyDep,
) -> Upload:
    if not storage.direct_uploads:
        raise HTTPException(
            409,
            "direct uploads need job files in object storage (STORAGE_URL=s3://...); "
            "send the file with POST /v1/jobs",
        )
    spec = get_kind(req.kind)
    if spec is None:
        raise HTTPException(
            422, f"unknown kind {req.kind!r}; available: {', '.join(available_kinds()) or 'none'}"
        )
    cfg = parse_config(spec, json.dumps(req.config))
    check_budget(cfg, settings)
    if req.size > settings.max_upload_bytes:
        raise HTTPException(
            413,
            f"{req.size} bytes is over the upload limit of {settings.max_upload_mb:g} MiB "
            "(MAX_UPLOAD_MB)",
        )
    try:
        job_id, paths, room = await run_in_threadpool(request.app.state.quotas.admit, key)
    except QuotaExceeded as exc:
        if exc.status_code in (413, 429):
            quota_refused(exc.detail)
        raise HTTPException(exc.status_code, exc.detail, headers=exc.headers) from None
    name = safe_name(req.filename)
    # Half the reservation's life: parts sent in time leave room to complete before it lapses.
    expires = max(1, int(settings.stale_upload_s / 2))

    def begin():
        if req.size > room:
            raise IntakeError(
                413,
                f"{req.size} bytes is over the room left to this API key under "
                f"QUOTA_STORED_MB ({room} bytes)",
            )
        if req.callback_url and req.callback_url.strip():
            admit_callback(req.callback_url, key, paths, storage, settings)
        up = storage.start_upload(job_id, f"upload/{name}", req.size, expires_s=expires)
        state = {
            "kind": spec.name,
            "config": cfg,
            "filename": req.filename,
            "key": f"upload/{name}",
            "size": req.size,
            "part_size": up.part_size,
            "upload_id": up.upload_id,
        }
        storage.put_bytes(job_id, STATE_KEY, json.dumps(state).encode())
        return up

    try:
        up = await run_in_threadpool(begin)
    except IntakeError as exc:
        await run_in_threadpool(discard, store, storage, job_id)
        raise HTTPException(exc.status_code, exc.detail) from None
    except BaseException:
        await run_in_threadpool(discard, store, storage, job_id)
        raise
    return Upload(
        id=job_id,
        part_size=up.part_size,
        part_urls=up.part_urls,
        expires_in_s=expires,
        complete_url=f"/v1/uploads/{job_id}/complete",
    )


def _state(storage: Storage, job_id: str) -> dict:
    try:
        return json.loads(storage.get_bytes(job_id, STATE_KEY))
    except FileNotFoundError:
        raise _no_upload(job_id) from None


def _complete(
    state: dict, job_id: str, storage: Storage, store: JobStore, settings: Settings
) -> Job:
    """Assemble the parts, fetch the file and run the intake on it (IntakeError for the client's
    mistakes)."""
    try:
        with store.keep_reserved(job_id, settings.stale_upload_s):
            return _assemble_and_make(state, job_id, storage, store, settings)
    except ReservationGone:
        raise reservation_gone(settings) from None


def _assemble_and_make(
    state: dict, job_id: str, storage: Storage, store: JobStore, settings: Settings
) -> Job:
    etags = storage.upload_parts(job_id, state["key"], state["upload_id"])
    expected = math.ceil(state["size"] / state["part_size"])
    if len(etags) < expected:
        raise _Incomplete(f"{len(etags)} of {expected} parts are in; PUT the rest, then complete")
    try:
        info = storage.finish_upload(job_id, state["key"], state["upload_id"], etags[:expected])
    except ValueError as exc:
        raise IntakeError(422, f"the upload cannot be assembled: {exc}") from None
    if info.size != state["size"]:
        raise IntakeError(
            422, f"the parts hold {info.size} bytes, not the {state['size']} announced"
        )
    work = storage.work_dir(job_id)
    dest = work.root / state["key"]
    storage.download(job_id, state["key"], dest)
    storage.delete(job_id, state["key"])
    storage.delete(job_id, STATE_KEY)
    spec = get_kind(state["kind"])
    upload = UploadedFile("dataset", state["filename"], dest)
    return finish_intake(spec, state["config"], upload, job_id, work, storage, store, settings)


class _Incomplete(Exception):
    """Parts are missing: the client may send them and complete again."""


@router.post(
    "/{job_id}/complete",
    status_code=202,
    response_model=Job,
    dependencies=OWNER,
    summary="Complete a direct upload: its file is checked and becomes a queued job",
    responses={
        404: {"description": "no such upload in progress"},
        409: {
            "description": "parts are missing (send them, then complete again), or the "
            "upload is being completed"
        },
        413: {"description": "the file passes the room left under QUOTA_STORED_MB"},
        415: {"description": "not a supported file"},
        422: {"description": "a bad file, or parts that do not make the announced size"},
    },
)
async def complete_upload(
    job_id: str,
    request: Request,
    settings: SettingsDep,
    storage: StorageDep,
    store: StoreDep,
    queue: QueueDep,
    key: KeyDep,
) -> Job:
    job_id = job_id_param(job_id)
    with _completing_lock:
        if job_id in _completing:
            raise HTTPException(409, f"upload {job_id} is being completed")
        _completing.add(job_id)
    try:
        return await _complete_once(job_id, request, settings, storage, store, queue, key)
    finally:
        with _completing_lock:
            _completing.discard(job_id)


async def _complete_once(
    job_id: str,
    request: Request,
    settings: Settings,
    storage: Storage,
    store: JobStore,
    queue: TaskQueue,
    key: ApiKey,
) -> Job:
    state = await run_in_threadpool(_state, storage, job_id)
    try:
        job = await run_in_threadpool(_complete, state, job_id, storage, store, settings)
        await run_in_threadpool(request.app.state.quotas.charge, key, job_id)
    except _Incomplete as exc:
        raise HTTPException(409, str(exc)) from None
    except FileNotFoundError:
        # Another request completed or cancelled it meanwhile: that one owns the job now.
        raise _no_upload(job_id) from None
    except IntakeError as exc:
        await run_in_threadpool(discard, store, storage, job_id)
        raise HTTPException(exc.status_code, exc.detail) from None
    except QuotaExceeded as exc:
        await run_in_threadpool(discard, store, storage, job_id)
        quota_refused(exc.detail)
        raise HTTPException(exc.status_code, exc.detail) from None
    except BaseException:
        await run_in_threadpool(discard, store, storage, job_id)
        raise
    try:
        await run_in_threadpool(queue.send_first, job)
    except Exception as exc:
        log.exception("could not enqueue job %s", job_id)
        await run_in_threadpool(discard, store, storage, job_id)
        raise HTTPException(503, f"the job queue is unavailable ({type(exc).__name__})") from None
    return job


@router.delete(
    "/{job_id}",
    status_code=204,
    dependencies=OWNER,
    summary="Cancel a direct upload (its parts are dropped, the reservation freed)",
    responses={404: {"description": "no such upload in progress"}},
)
def cancel_upload(job_id: str, storage: StorageDep, store: StoreDep) -> Response:
    job_id = job_id_param(job_id)
    _state(storage, job_id)
    discard(store, storage, job_id)
    return Response(status_code=204)
