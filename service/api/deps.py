"""FastAPI dependencies. Everything hangs off app.state so tests can build apps with other settings.

Routes take them through the `Annotated` aliases at the end (`store: StoreDep`), declared once
here, as full-stack-fastapi-template's `SessionDep`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api_schemas.jobs import Job
from core.settings import Settings
from core.storage import Storage, parse_job_id
from core.store import JobNotFound, JobStore
from service.auth import ApiKey, owns
from service.queue import TaskQueue


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_storage(request: Request) -> Storage:
    return request.app.state.storage


def get_store(request: Request) -> JobStore:
    return request.app.state.store


def get_queue(request: Request) -> TaskQueue:
    return request.app.state.queue


def job_id_param(job_id: str) -> str:
    try:
        return parse_job_id(job_id)
    except ValueError:
        raise HTTPException(404, f"job {job_id!r} not found") from None


def load_job(store: JobStore, job_id: str) -> Job:
    try:
        return store.get(job_id_param(job_id))
    except JobNotFound:
        raise HTTPException(404, f"job {job_id} not found") from None


# -- API keys (service/auth.py) ---------------------------------------------------------------
# The key itself is checked by the /v1 gate (service/api/gate.py) before the body is read;
# these dependencies hand it to the route and check job ownership. HTTPBearer only puts the
# scheme in the OpenAPI document. Every /v1 router declares GUARDS (or JOB_GUARDS) itself, and
# app.py refuses to start when a /v1 route lacks them.
bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="an API key from API_KEYS / API_KEYS_FILE, as `Authorization: Bearer <key>`",
)


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": 'Bearer realm="nf"'})


async def require_key(
    request: Request,
    _scheme: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> ApiKey:
    key = getattr(request.state, "api_key", None)
    if key is None:  # only when the gate is not installed (never in create_app)
        raise _unauthorized("an API key is required: send `Authorization: Bearer <key>`")
    return key


async def require_job_owner(request: Request, key: KeyDep, store: StoreDep) -> None:
    """A job of another key is answered exactly like a missing one. Only for routes whose path
    has {job_id} (app.py checks that at start-up)."""
    job_id = job_id_param(request.path_params["job_id"])
    if not await run_in_threadpool(owns, store, job_id, key):
        raise HTTPException(404, f"job {job_id} not found")


GUARDS = [Depends(require_key)]
OWNER = [Depends(require_job_owner)]
JOB_GUARDS = [*GUARDS, *OWNER]


# -- what routes declare -----------------------------------------------------------------------
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
StorageDep = Annotated[Storage, Depends(get_storage)]
StoreDep = Annotated[JobStore, Depends(get_store)]
QueueDep = Annotated[TaskQueue, Depends(get_queue)]
KeyDep = Annotated[ApiKey, Depends(require_key)]
