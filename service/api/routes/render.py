"""Rendering a trained field: the API validates, the render queue does the work."""

from __future__ import annotations

import asyncio
import base64

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response

from api_schemas.jobs import JobStatus
from api_schemas.render import PathRequest, RenderRequest
from core.settings import Settings
from core.store import JobStore
from service.api.deps import (
    JOB_GUARDS,
    current_key,
    get_queue,
    get_settings_dep,
    get_store,
    load_job,
)
from service.auth import ApiKey
from service.queue import RenderTimeout, TaskQueue

router = APIRouter(prefix="/v1/jobs", tags=["render"], dependencies=JOB_GUARDS)
RENDER_ERRORS = {
    409: {"description": "the job has not succeeded (yet)"},
    429: {"description": "render pixel budget of this key spent (Retry-After says when)"},
    504: {"description": "the render did not finish within RENDER_TIMEOUT_S"},
}


async def _run(queue: TaskQueue, job_id: str, body: dict, path: bool) -> Response:
    try:
        result = await queue.render(job_id, body, path=path)
    except RenderTimeout as exc:
        raise HTTPException(504, str(exc)) from None
    except Exception as exc:  # a worker-side crash comes back as an exception
        raise HTTPException(500, f"render failed: {type(exc).__name__}: {exc}") from None
    if "error" in result:
        err = result["error"]
        raise HTTPException(int(err.get("status_code", 500)), err.get("detail", "render failed"))
    # A path render can be 100+ MB: decode it off the event loop.
    data = await asyncio.to_thread(base64.b64decode, result["data_b64"])
    return Response(data, media_type=result["content_type"])


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


async def rate_limited(request: Request, key: ApiKey = Depends(current_key)) -> None:
    """For other worker-side calls on a trained job (exports): each costs one frame of
    MAX_RENDER_PIXELS from the same pixel bucket."""
    await charge_pixels(request, key, request.app.state.settings.max_render_pixels)


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


def _check(store: JobStore, job_id: str):
    job = load_job(store, job_id)
    if job.status != JobStatus.succeeded:
        raise HTTPException(409, f"job is {job.status.value}; renders need a succeeded job")
    return job


@router.post(
    "/{job_id}/render",
    response_class=Response,
    summary="Render one frame",
    responses={
        200: {"content": {"image/png": {}, "image/jpeg": {}}, "description": "the frame"},
        **RENDER_ERRORS,
    },
)
async def render(
    request: Request,
    job_id: str,
    req: RenderRequest,
    store: JobStore = Depends(get_store),
    settings: Settings = Depends(get_settings_dep),
    queue: TaskQueue = Depends(get_queue),
    key: ApiKey = Depends(current_key),
) -> Response:
    _caps(settings, req.width, req.height)
    # Charged before the status check: a render of an unfinished job costs like any other.
    await charge_pixels(request, key, req.width * req.height)
    job = _check(store, job_id)
    return await _run(queue, job.id, req.model_dump(mode="json", exclude_none=True), path=False)


@router.post(
    "/{job_id}/render/path",
    response_class=Response,
    summary="Render frames along a camera path",
    responses={200: {"content": {"image/webp": {}, "application/zip": {}}}, **RENDER_ERRORS},
)
async def render_path(
    request: Request,
    job_id: str,
    req: PathRequest,
    store: JobStore = Depends(get_store),
    settings: Settings = Depends(get_settings_dep),
    queue: TaskQueue = Depends(get_queue),
    key: ApiKey = Depends(current_key),
) -> Response:
    _caps(settings, req.width, req.height, req.frames)
    await charge_pixels(request, key, req.frames * req.width * req.height)
    job = _check(store, job_id)
    return await _run(queue, job.id, req.model_dump(mode="json", exclude_none=True), path=True)


# The first name this route had; kept so early clients keep working.
router.add_api_route(
    "/{job_id}/render_path",
    render_path,
    methods=["POST"],
    response_class=Response,
    include_in_schema=False,
)
