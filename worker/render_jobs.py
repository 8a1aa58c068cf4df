"""Render jobs: work too large for an HTTP wait, polled at renders/{id} (core/path_jobs.py).

nf.render_path_job renders a camera path into the artifact `path-<render_id>.<format>`;
nf.render_frame_job one frame over the API's RENDER_WAIT_PIXELS (or its estimate from the job's
render speed), in bands of rows, into `frame-<render_id>.<ext>`. Progress (frames_done,
pixels_done) and the outcome go to the render job's row, under its lease: each write checks in
its transaction that the lease is still this delivery's (a fenced `path_jobs.update`), and a
render whose lease was lost (taken over, or not renewed in time) stops at its next frame or band
and stores nothing. MAX_RENDER_JOB_S bounds each."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from pydantic import ValidationError

from api_schemas.tasks import RenderFrameJobTask, RenderPathJobTask
from core import leases, path_jobs, usage
from core.settings import get_settings
from core.storage import JobPaths
from worker.app import app
from worker.jobs import RenderError, kind_function
from worker.tasks import _checkpoint, _invalid, _short_error, _store, work_dir

log = logging.getLogger(__name__)

REPORT_S = 0.5  # progress is rewritten at most this often


def _check(claim) -> None:
    """LeaseLost once the render job's lease is no longer surely this delivery's."""
    if claim is not None and claim.lost.is_set():
        raise leases.LeaseLost("the render job's lease was lost")


def _open(task_cls, job_id: str, render_id: str, request: dict[str, Any], claim=None):
    """(store, paths, task) of a render job, or None when it was deleted or its message does not
    validate (then the render job is failed with the reason)."""
    store = _store()
    try:
        paths = store.storage.paths(job_id)
        path_jobs.read(paths, render_id)
    except (ValueError, FileNotFoundError):
        log.warning("%s: %s/%s does not exist (deleted?)", task_cls.name, job_id, render_id)
        return None
    try:
        task = task_cls.model_validate(
            {"job_id": job_id, "render_id": render_id, "request": request}
        )
    except ValidationError as exc:
        path_jobs.update(
            paths, render_id, fence=claim, status="failed", error=_invalid(exc)["error"]["detail"]
        )
        return None
    return store, paths, task


def _reporter(
    paths: JobPaths, render_id: str, field: str, claim=None
) -> Callable[[int, int], None]:
    last = [0.0]

    def report(done: int, total: int) -> None:
        _check(claim)  # called every frame or band: where a lost lease stops the render
        now = time.monotonic()
        if done == total or now - last[0] >= REPORT_S:
            last[0] = now
            path_jobs.update(paths, render_id, fence=claim, **{field: done})

    return report


def _fail(
    paths: JobPaths, job_id: str, render_id: str, exc: Exception, what: str, claim=None
) -> None:
    if isinstance(exc, leases.LeaseLost):
        log.error(
            "%s job %s of %s: its lease was lost; stopped, leaving it", what, render_id, job_id
        )
        return
    if isinstance(exc, RenderError):
        error = exc.detail
    elif isinstance(exc, SoftTimeLimitExceeded):
        limit = get_settings().max_render_job_s
        error = f"the render ran past its time ceiling of {limit:g} s (MAX_RENDER_JOB_S)"
    else:
        log.exception("%s job %s of %s failed", what, render_id, job_id)
        error = f"render failed: {_short_error(exc)}"
    try:
        path_jobs.update(paths, render_id, fence=claim, status="failed", error=error)
    except (OSError, ValueError):
        pass  # the job was deleted meanwhile
    except leases.LeaseLost:
        log.error(
            "%s job %s of %s: its lease was lost; its failure not written", what, render_id, job_id
        )


def _start(store, job_id: str, paths: JobPaths, work: JobPaths, render_id: str, claim=None):
    """The checkpoint the render job uses (brought into the working copy `work`), recorded
    with its running status."""
    checkpoint = _checkpoint(job_id, work, store.storage)
    path_jobs.update(
        paths, render_id, fence=claim, status="running", checkpoint_step=checkpoint.step
    )
    work.artifacts.mkdir(parents=True, exist_ok=True)
    return checkpoint


def _leased(job_id: str, render_id: str, body: Callable[[Any], None]) -> None:
    """Run `body` holding the render job's lease: a second delivery leaves it to the live
    worker, a finished one is not rendered again, and one whose workers died MAX_WORKER_LOSSES
    times fails instead of taking the next worker down too."""
    try:
        paths = _store().storage.paths(job_id)
        with path_jobs.running(paths, render_id) as claim:
            if claim is None:
                log.info("render job %s/%s is rendered by another worker", job_id, render_id)
                return
            if path_jobs.read(paths, render_id)["status"] in ("succeeded", "failed"):
                return
            cap = get_settings().max_worker_losses
            if claim.losses >= cap:
                path_jobs.update(
                    paths,
                    render_id,
                    fence=claim,
                    status="failed",
                    error=f"worker lost {claim.losses} times (MAX_WORKER_LOSSES={cap}): the "
                    "render process died each time (out of memory? a crash?)",
                )
                return
            body(claim)
        usage.refresh(get_settings(), _store().storage, job_id)
    except (ValueError, FileNotFoundError):
        log.warning("render job %s/%s does not exist (deleted?)", job_id, render_id)
    except leases.LeaseLost:
        log.error("render job %s/%s: its lease was lost; stopped, leaving it", job_id, render_id)


def _render_task(task_cls, render: str):
    """task_cls's Celery task: this module's function `render` (job_id, render_id, request,
    claim) under the render job's lease. Looked up at each delivery, so that one set on the module
    in its place (a stand-in that dies, say) is the one that runs."""

    @app.task(
        name=task_cls.name,
        ignore_result=True,
        acks_late=False,
        soft_time_limit=get_settings().max_render_job_s,
    )
    def run(job_id: str, render_id: str, request: dict[str, Any]) -> None:
        body = globals()[render]
        _leased(job_id, render_id, lambda claim: body(job_id, render_id, request, claim))

    return run


def _render_path_job(job_id: str, render_id: str, request: dict[str, Any], claim=None) -> None:
    opened = _open(RenderPathJobTask, job_id, render_id, request, claim)
    if opened is None:
        return
    store, paths, task = opened
    name = path_jobs.artifact_name(render_id, task.request.format)
    with work_dir(store.storage, job_id) as work:
        tmp = work.artifacts / f".{name}.tmp"
        try:
            job = store.get(job_id)
            fn = kind_function(job.kind.value, "render_path_to")
            if fn is None:
                raise RenderError(422, f"{job.kind.value} jobs do not render camera paths")
            checkpoint = _start(store, job_id, paths, work, render_id, claim)
            with open(tmp, "wb") as out:
                report = _reporter(paths, render_id, "frames_done", claim)
                fn(job, checkpoint, task.request, out, report)
            _check(claim)  # nothing stored by a delivery that lost its lease
            tmp.replace(work.artifacts / name)
            store.storage.push(job_id, f"artifacts/{name}")
        except Exception as exc:
            tmp.unlink(missing_ok=True)
            _fail(paths, job_id, render_id, exc, "path", claim)
            return
    path_jobs.update(paths, render_id, fence=claim, status="succeeded", artifact=name)


def _render_frame_job(job_id: str, render_id: str, request: dict[str, Any], claim=None) -> None:
    opened = _open(RenderFrameJobTask, job_id, render_id, request, claim)
    if opened is None:
        return
    store, paths, task = opened
    request = task.request
    name = path_jobs.artifact_name(render_id, request.format, "frame")
    try:
        job = store.get(job_id)
        tiled = kind_function(job.kind.value, "render_frame_to")
        whole = kind_function(job.kind.value, "render")
        if tiled is None and whole is None:
            raise RenderError(422, f"{job.kind.value} jobs do not render frames")
        with work_dir(store.storage, job_id) as work:
            checkpoint = _start(store, job_id, paths, work, render_id, claim)
        if tiled is not None:
            report = _reporter(paths, render_id, "pixels_done", claim)
            data, _ = tiled(job, checkpoint, request, report)
        else:  # a kind that renders a frame at once (image: fast at any size)
            data, _ = whole(job, checkpoint, request)
        _check(claim)  # nothing stored by a delivery that lost its lease
        store.storage.put_bytes(job_id, f"artifacts/{name}", data)
    except Exception as exc:
        _fail(paths, job_id, render_id, exc, "frame", claim)
        return
    n_pixels = path_jobs.read(paths, render_id).get("n_pixels")
    path_jobs.update(
        paths,
        render_id,
        fence=claim,
        status="succeeded",
        artifact=name,
        frames_done=1,
        pixels_done=n_pixels,
    )


render_path_job = _render_task(RenderPathJobTask, "_render_path_job")
render_frame_job = _render_task(RenderFrameJobTask, "_render_frame_job")
