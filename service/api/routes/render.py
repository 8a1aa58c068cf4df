"""Rendering a trained field: the API validates, the render queue does the work."""

from __future__ import annotations

import base64

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response

from api_schemas.jobs import JobStatus
from api_schemas.render import PathRequest, RenderRequest
from core.settings import Settings
from core.store import JobStore
from service.api.deps import current_key, get_queue, get_settings_dep, get_store, load_job
from service.auth import ApiKey
from service.queue import RenderTimeout, TaskQueue

router = APIRouter(prefix="/v1/jobs", tags=["render"])
RENDER_ERRORS = {
    409: {"description": "the job has not succeeded (yet)"},
    429: {"description": "render rate limit for this key (Retry-After says when)"},
    504: {"description": "the render did not finish within RENDER_TIMEOUT_S"},
}


def _run(queue: TaskQueue, job_id: str, body: dict, path: bool) -> Response:
    try:
        result = queue.render(job_id, body, path=path)
    except RenderTimeout as exc:
        raise HTTPException(504, str(exc)) from None
    except Exception as exc:  # a worker-side crash comes back as an exception
        raise HTTPException(500, f"render failed: {type(exc).__name__}: {exc}") from None
    if "error" in result:
        err = result["error"]
        raise HTTPException(int(err.get("status_code", 500)), err.get("detail", "render failed"))
    return Response(base64.b64decode(result["data_b64"]), media_type=result["content_type"])


def rate_limited(request: Request, key: ApiKey = Depends(current_key)) -> None:
    """Render and path requests share one token bucket per key (RENDER_RATE_PER_MIN, RENDER_BURST)."""
    wait = request.app.state.render_limit.take(key.id)
    if wait > 0:
        retry = request.app.state.render_limit.retry_after(wait)
        raise HTTPException(
            429,
            f"render rate limit reached for this API key; retry in {retry} s",
            headers={"Retry-After": retry},
        )


def _check(
    store: JobStore, settings: Settings, job_id: str, width: int, height: int, frames: int = 1
):
    job = load_job(store, job_id)
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
    if job.status != JobStatus.succeeded:
        raise HTTPException(409, f"job is {job.status.value}; renders need a succeeded job")
    return job


@router.post(
    "/{job_id}/render",
    response_class=Response,
    summary="Render one frame",
    dependencies=[Depends(rate_limited)],
    responses={
        200: {"content": {"image/png": {}, "image/jpeg": {}}, "description": "the frame"},
        **RENDER_ERRORS,
    },
)
def render(
    job_id: str,
    req: RenderRequest,
    store: JobStore = Depends(get_store),
    settings: Settings = Depends(get_settings_dep),
    queue: TaskQueue = Depends(get_queue),
) -> Response:
    job = _check(store, settings, job_id, req.width, req.height)
    return _run(queue, job.id, req.model_dump(mode="json", exclude_none=True), path=False)


@router.post(
    "/{job_id}/render/path",
    response_class=Response,
    summary="Render frames along a camera path",
    dependencies=[Depends(rate_limited)],
    responses={200: {"content": {"image/webp": {}, "application/zip": {}}}, **RENDER_ERRORS},
)
def render_path(
    job_id: str,
    req: PathRequest,
    store: JobStore = Depends(get_store),
    settings: Settings = Depends(get_settings_dep),
    queue: TaskQueue = Depends(get_queue),
) -> Response:
    job = _check(store, settings, job_id, req.width, req.height, req.frames)
    return _run(queue, job.id, req.model_dump(mode="json", exclude_none=True), path=True)


# The first name this route had; kept so early clients keep working.
router.add_api_route(
    "/{job_id}/render_path",
    render_path,
    methods=["POST"],
    response_class=Response,
    dependencies=[Depends(rate_limited)],
    include_in_schema=False,
)
