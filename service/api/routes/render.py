"""Rendering a trained field: the API validates, the render queue does the work.

A running job renders its latest checkpoint (a preview while it trains); every render answers
with `X-Checkpoint-Step`. A long camera path, and a frame too large for one HTTP wait, run as
render jobs (routes/path_jobs.py)."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from api_schemas.jobs import Job, JobStatus
from api_schemas.render import PathJob, PathRequest, RenderJob, RenderRequest
from core import path_jobs
from core.settings import Settings
from core.storage import CHECKPOINT_RE, LATEST_NAME, Storage
from core.store import JobStore
from service.api.deps import (
    JOB_GUARDS,
    KeyDep,
    QueueDep,
    SettingsDep,
    StorageDep,
    StoreDep,
    load_job,
)
from service.api.routes.path_jobs import path_job_view
from service.auth import ApiKey
from service.queue import RenderTimeout, TaskQueue

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["render"], dependencies=JOB_GUARDS)
RENDER_ERRORS = {
    409: {"description": "the job is queued, failed or cancelled, or has no checkpoint yet"},
    429: {"description": "render pixel budget of this key spent (Retry-After says when)"},
    504: {"description": "the render did not finish within RENDER_TIMEOUT_S"},
}


async def _run(queue: TaskQueue, job_id: str, req: RenderRequest | PathRequest) -> Response:
    try:
        result = await queue.render(job_id, req)
    except RenderTimeout as exc:
        raise HTTPException(504, str(exc)) from None
    except Exception:  # a worker-side crash comes back as an exception; its text stays in logs
        log.exception("render of job %s failed on the worker", job_id)
        raise HTTPException(500, "the render failed on the worker (its cause is logged)") from None
    if "error" in result:
        err = result["error"]
        raise HTTPException(int(err.get("status_code", 500)), err.get("detail", "render failed"))
    data = result["data"]
    headers = {}
    if result.get("checkpoint_step") is not None:
        headers["X-Checkpoint-Step"] = str(result["checkpoint_step"])
    return Response(data, media_type=result["content_type"], headers=headers)


async def charge_pixels(request: Request, key: ApiKey, pixels: int) -> None:
    """Render and path requests share one pixel bucket per key (RENDER_PIXELS_PER_MIN,
    RENDER_PIXEL_BURST): a request costs width x height x frames."""
    bucket = request.app.state.render_limit
    wait = await bucket.take(key.id, pixels)
    if wait > 0:
        retry = bucket.retry_after(wait)
        raise HTTPException(
            429,
            f"render rate limit (RENDER_PIXELS_PER_MIN) reached for this API key: "
            f"{pixels} pixels asked; retry in {retry} s",
            headers={"Retry-After": retry},
        )


async def rate_limited(request: Request, key: KeyDep, settings: SettingsDep) -> None:
    """For other worker-side calls on a trained job (exports): each costs one frame of
    MAX_RENDER_PIXELS from the same pixel bucket."""
    await charge_pixels(request, key, settings.max_render_pixels)


def _caps(settings: Settings, width: int, height: int, frames: int = 1) -> None:
    if width * height > settings.max_render_pixels:
        raise HTTPException(
            422,
            f"{width}x{height} = {width * height} pixels is over the render limit of "
            f"{settings.max_render_pixels} (MAX_RENDER_PIXELS)",
        )
    if frames > settings.max_path_frames:
        raise HTTPException(
            422,
            f"{frames} frames is over the path limit of {settings.max_path_frames} "
            f"(MAX_PATH_FRAMES)",
        )
    if frames > 1 and frames * width * height > settings.max_path_pixels:
        raise HTTPException(
            422,
            f"{frames} frames of {width}x{height} = {frames * width * height} pixels is over "
            f"the path limit of {settings.max_path_pixels} (MAX_PATH_PIXELS)",
        )


def frame_seconds(job: Job, pixels: int) -> float | None:
    """What the job's own measurements say a frame of `pixels` takes on its workers: the speed
    its final evaluation rendered and scored test pixels at (`render_pixels_per_s`), else, while
    it trains, its training rays a second (a step also runs the backward pass: an overestimate).
    None when the job measured neither (image jobs)."""
    rate = job.metrics.get("render_pixels_per_s") or job.progress.rays_per_s
    return pixels / rate if rate else None


def frame_as_job(settings: Settings, job: Job, req: RenderRequest) -> bool:
    """A frame runs as a render job when asked to, or (no `mode`) when it is over
    RENDER_WAIT_PIXELS or its estimate is over half of RENDER_TIMEOUT_S."""
    if req.mode is not None:
        return req.mode == "job"
    pixels = req.width * req.height
    if pixels > settings.render_wait_pixels:
        return True
    seconds = frame_seconds(job, pixels)
    return seconds is not None and seconds > 0.5 * settings.render_timeout_s


def _has_checkpoint(storage: Storage, job_id: str) -> bool:
    """A `latest` pointer or a checkpoint's tensors among the job's objects."""
    return storage.exists(job_id, f"checkpoints/{LATEST_NAME}") or any(
        CHECKPOINT_RE.match(o.key.rsplit("/", 1)[-1]) for o in storage.list(job_id, "checkpoints/")
    )


def _check(store: JobStore, storage: Storage, job_id: str):
    job = load_job(store, job_id)
    if job.status not in (JobStatus.succeeded, JobStatus.running):
        raise HTTPException(
            409, f"job is {job.status.value}; renders need a running or succeeded job"
        )
    # Answered here rather than by a worker: a preview must not wait behind the training that
    # has not written its first checkpoint yet (one worker may serve both queues).
    if not _has_checkpoint(storage, job_id):
        raise HTTPException(
            409, f"job is {job.status.value} and has no checkpoint yet; try again shortly"
        )
    return job


async def _queued_render_job(storage, send, job_id: str, req, frames: int, **state) -> Response:
    """A render job of req stored (with `state` beside its request) and sent with `send`; the 202
    that points at it."""
    render_id = path_jobs.new_id()
    created = await asyncio.to_thread(
        path_jobs.create,
        storage.paths(job_id),
        render_id,
        job_id,
        req.format,
        frames,
        request=req.model_dump(mode="json"),
        **state,
    )
    await asyncio.to_thread(send, job_id, render_id, req)
    view = path_job_view(created)
    return JSONResponse(view.model_dump(), status_code=202, headers={"Location": view.url})


@router.post(
    "/{job_id}/render",
    response_class=Response,
    summary="Render one frame",
    responses={
        200: {"content": {"image/png": {}, "image/jpeg": {}}, "description": "the frame"},
        202: {"model": RenderJob, "description": "a frame render job: poll its url"},
        **RENDER_ERRORS,
    },
)
async def render(
    request: Request,
    job_id: str,
    req: RenderRequest,
    store: StoreDep,
    storage: StorageDep,
    settings: SettingsDep,
    queue: QueueDep,
    key: KeyDep,
) -> Response:
    _caps(settings, req.width, req.height)
    # Charged before the status check: a render of an unfinished job costs like any other.
    await charge_pixels(request, key, req.width * req.height)
    job = await asyncio.to_thread(_check, store, storage, job_id)
    if frame_as_job(settings, job, req):
        return await _queued_render_job(
            storage,
            queue.send_frame_job,
            job.id,
            req,
            1,
            kind="frame",
            n_pixels=req.width * req.height,
        )
    return await _run(queue, job.id, req)


@router.post(
    "/{job_id}/render/path",
    response_class=Response,
    summary="Render frames along a camera path",
    responses={
        200: {
            "content": {
                "image/webp": {},
                "image/gif": {},
                "video/mp4": {},
                "application/zip": {},
            }
        },
        202: {"model": PathJob, "description": "a path job: poll its url"},
        **RENDER_ERRORS,
    },
)
async def render_path(
    request: Request,
    job_id: str,
    req: PathRequest,
    store: StoreDep,
    storage: StorageDep,
    settings: SettingsDep,
    queue: QueueDep,
    key: KeyDep,
) -> Response:
    _caps(settings, req.width, req.height, req.frames)
    await charge_pixels(request, key, req.frames * req.width * req.height)
    job = await asyncio.to_thread(_check, store, storage, job_id)
    # fps stated in the message, for workers that read it rather than frames_per_second
    req = req.model_copy(update={"fps": req.frames_per_second})
    pixels = req.frames * req.width * req.height
    if req.mode == "job" or (req.mode is None and pixels > settings.path_wait_pixels):
        return await _queued_render_job(storage, queue.send_path_job, job.id, req, req.frames)
    return await _run(queue, job.id, req)


# The first name this route had; kept so early clients keep working.
router.add_api_route(
    "/{job_id}/render_path",
    render_path,
    methods=["POST"],
    response_class=Response,
    include_in_schema=False,
)
