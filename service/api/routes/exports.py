"""Exports of a trained scene (meshes, point clouds, splat files): validated here, made on a
worker (`nf.export`), state in `<job>/exports/<id>.json`, the file in the job's artifacts."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, HTTPException, Response

from api_schemas.exports import (
    FORMATS_BY_KIND,
    Export,
    ExportList,
    ExportRequest,
    ExportStatus,
    options_for,
)
from api_schemas.jobs import JobKind, JobStatus
from core.exports import ExportNotFound, ExportStore
from core.settings import Settings
from service.api.deps import JOB_GUARDS, QueueDep, SettingsDep, StorageDep, StoreDep, load_job
from service.api.routes.render import rate_limited

router = APIRouter(prefix="/v1/jobs", tags=["exports"], dependencies=JOB_GUARDS)


def _check_options(req: ExportRequest, settings: Settings, kind: JobKind) -> dict:
    given = req.options.model_dump(exclude_none=True)
    allowed = options_for(req.format, kind)
    extra = sorted(set(given) - set(allowed))
    if extra:
        raise HTTPException(
            422,
            f"option(s) {', '.join(extra)} do not apply to format {req.format.value!r} "
            f"(it takes: {', '.join(allowed) or 'no options'})",
        )
    res = given.get("resolution")
    if res is not None and res > settings.max_export_resolution:
        raise HTTPException(
            422,
            f"resolution {res} is over the export limit of {settings.max_export_resolution} "
            "(MAX_EXPORT_RESOLUTION)",
        )
    return given


@router.post(
    "/{job_id}/exports",
    response_model=Export,
    status_code=202,
    summary="Export the trained scene as a mesh, point cloud or splat file (runs on a worker)",
    dependencies=[Depends(rate_limited)],
    responses={
        200: {"model": Export, "description": "this export (same format and options) exists"},
        409: {"description": "the job has not succeeded"},
        422: {"description": "unknown format, a format the job's kind has not, bad options"},
        503: {"description": "the queue is unreachable"},
    },
)
def create_export(
    job_id: str,
    req: ExportRequest,
    response: Response,
    store: StoreDep,
    storage: StorageDep,
    settings: SettingsDep,
    queue: QueueDep,
) -> Export:
    job = load_job(store, job_id)
    formats = FORMATS_BY_KIND.get(job.kind, ())
    if req.format not in formats:
        raise HTTPException(
            422,
            f"format {req.format.value!r} is not available for {job.kind.value} jobs"
            + (f"; use one of: {', '.join(f.value for f in formats)}" if formats else ""),
        )
    options = _check_options(req, settings, job.kind)
    if job.status != JobStatus.succeeded:
        raise HTTPException(409, f"job is {job.status.value}; exports need a succeeded job")
    exports = ExportStore(storage)
    export, created = exports.create_or_get(job.id, req.format, options)
    response.headers["Location"] = f"/v1/jobs/{job.id}/exports/{export.id}"
    if not created:
        response.status_code = 200
        return export
    try:
        queue.send_export(job.id, export.id)
    except Exception as exc:
        # The broker's exception names its host: logged here, only its type goes out.
        logging.getLogger(__name__).warning("could not queue export %s: %s", export.id, exc)
        reason = f"the task queue is unreachable ({type(exc).__name__})"
        exports.update(job.id, export.id, status=ExportStatus.failed, error=reason)
        raise HTTPException(503, reason) from None
    return export


@router.get("/{job_id}/exports", response_model=ExportList, summary="The job's exports")
def list_exports(job_id: str, store: StoreDep, storage: StorageDep) -> ExportList:
    job = load_job(store, job_id)
    return ExportList(items=ExportStore(storage).list(job.id))


@router.get("/{job_id}/exports/{export_id}", response_model=Export, summary="One export's state")
def get_export(job_id: str, export_id: str, store: StoreDep, storage: StorageDep) -> Export:
    job = load_job(store, job_id)
    try:
        return ExportStore(storage).get(job.id, export_id)
    except ExportNotFound:
        raise HTTPException(404, f"job {job.id} has no export {export_id!r}") from None
