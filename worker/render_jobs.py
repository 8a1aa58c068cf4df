"""nf.render_frame_job: one frame too large for an HTTP wait (the API's RENDER_WAIT_PIXELS or its
estimate from the job's render speed), rendered in bands of rows into the job's artifact
`frame-<render_id>.<ext>`, with pixels_done and the outcome in the render job's state
(core/path_jobs.py, kind frame). Path jobs are worker.tasks.render_path_job."""

from __future__ import annotations

import logging
import time
from typing import Any

from pydantic import ValidationError

from api_schemas.tasks import RenderFrameJobTask
from core import path_jobs
from core.storage import atomic_write_bytes
from worker.app import app
from worker.jobs import RenderError, kind_function
from worker.tasks import PATH_JOB_REPORT_S, _checkpoint, _invalid, _short_error, _store

log = logging.getLogger(__name__)


@app.task(name=RenderFrameJobTask.name, ignore_result=True, acks_late=False)
def render_frame_job(job_id: str, render_id: str, request: dict[str, Any]) -> None:
    store = _store()
    try:
        paths = store.storage.paths(job_id)
        path_jobs.read(paths, render_id)
    except (ValueError, FileNotFoundError):
        log.warning("nf.render_frame_job: %s/%s does not exist (deleted?)", job_id, render_id)
        return
    try:
        task = RenderFrameJobTask.model_validate(
            {"job_id": job_id, "render_id": render_id, "request": request}
        )
    except ValidationError as exc:
        path_jobs.update(paths, render_id, status="failed", error=_invalid(exc)["error"]["detail"])
        return
    request = task.request
    name = path_jobs.artifact_name(render_id, request.format, "frame")
    last = [0.0]

    def on_pixels(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= PATH_JOB_REPORT_S:
            last[0] = now
            path_jobs.update(paths, render_id, pixels_done=done)

    try:
        job = store.get(job_id)
        tiled = kind_function(job.kind.value, "render_frame_to")
        whole = kind_function(job.kind.value, "render")
        if tiled is None and whole is None:
            raise RenderError(422, f"{job.kind.value} jobs do not render frames")
        checkpoint = _checkpoint(job_id, paths)
        path_jobs.update(paths, render_id, status="running", checkpoint_step=checkpoint.step)
        if tiled is not None:
            data, _ = tiled(job, checkpoint, request, on_pixels)
        else:  # a kind that renders a frame at once (image: fast at any size)
            data, _ = whole(job, checkpoint, request)
        paths.artifacts.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(paths.artifacts / name, data)
    except Exception as exc:
        if isinstance(exc, RenderError):
            error = exc.detail
        else:
            log.exception("frame job %s of %s failed", render_id, job_id)
            error = f"render failed: {_short_error(exc)}"
        try:
            path_jobs.update(paths, render_id, status="failed", error=error)
        except (OSError, ValueError):
            pass  # the job was deleted meanwhile
        return
    n_pixels = path_jobs.read(paths, render_id).get("n_pixels")
    path_jobs.update(
        paths, render_id, status="succeeded", artifact=name, frames_done=1, pixels_done=n_pixels
    )
