"""Path jobs (camera paths rendered in the background, core/path_jobs.py): their state while
they render, and where their file lands (an artifact of the job)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from api_schemas.render import PathJob
from core import path_jobs
from service.api.deps import JOB_GUARDS, StorageDep, StoreDep, load_job

router = APIRouter(prefix="/v1/jobs", tags=["render"], dependencies=JOB_GUARDS)


def path_job_view(state: dict) -> PathJob:
    base = f"/v1/jobs/{state['job_id']}"
    artifact = state.get("artifact")
    return PathJob(
        **state,
        url=f"{base}/renders/{state['id']}",
        artifact_url=f"{base}/artifacts/{artifact}" if artifact else None,
    )


@router.get(
    "/{job_id}/renders/{render_id}",
    response_model=PathJob,
    summary="State of a path job (frames done; the artifact once succeeded)",
    responses={404: {"description": "no such path job"}},
)
def get_path_job(job_id: str, render_id: str, store: StoreDep, storage: StorageDep) -> PathJob:
    job = load_job(store, job_id)
    try:
        state = path_jobs.read(storage.paths(job.id), render_id)
    except (ValueError, FileNotFoundError):
        raise HTTPException(404, f"job {job.id} has no path job {render_id!r}") from None
    return path_job_view(state)
