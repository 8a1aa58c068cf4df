"""FastAPI dependencies. Everything hangs off app.state so tests can build apps with other settings."""

from __future__ import annotations

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPBearer

from api_schemas.jobs import Job
from core.settings import Settings
from core.storage import LocalStorage, parse_job_id
from core.store import JobNotFound, JobStore
from service.auth import ApiKey, KeyRing, bearer_token, owns
from service.queue import TaskQueue


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_storage(request: Request) -> LocalStorage:
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
# HTTPBearer only puts the scheme in the OpenAPI document; the check below does the work, so
# every failure is the same JSON 401 with WWW-Authenticate.
bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="an API key from API_KEYS / API_KEYS_FILE, as `Authorization: Bearer <key>`",
)
EVENTS_SUFFIX = "/events"


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": 'Bearer realm="nf"'})


def require_key(request: Request, _scheme=Depends(bearer_scheme)) -> ApiKey:
    keys: KeyRing = request.app.state.keys
    token = bearer_token(request.headers.get("authorization"))
    if token is None and request.url.path.endswith(EVENTS_SUFFIX):
        # EventSource cannot set headers, so the event stream alone takes the key in the URL.
        token = request.query_params.get("access_token") or None
    if token is None:
        raise _unauthorized("an API key is required: send `Authorization: Bearer <key>`")
    key = keys.match(token)
    if key is None:
        raise _unauthorized(
            "invalid API key"
            if len(keys)
            else "this server has no API keys configured (set API_KEYS or API_KEYS_FILE)"
        )
    request.state.api_key = key
    return key


def require_job_owner(request: Request, key: ApiKey = Depends(require_key)) -> None:
    """On routes with a {job_id}: a job of another key is answered exactly like a missing one."""
    raw = request.path_params.get("job_id")
    if raw is None:
        return
    storage: LocalStorage = request.app.state.storage
    job_id = job_id_param(raw)
    if not owns(storage.paths(job_id), key):
        raise HTTPException(404, f"job {job_id} not found")


def current_key(key: ApiKey = Depends(require_key)) -> ApiKey:
    return key


V1_DEPENDENCIES = [Depends(require_key), Depends(require_job_owner)]
