"""FastAPI dependencies. Everything hangs off app.state so tests can build apps with other settings."""

from __future__ import annotations

from fastapi import HTTPException, Request

from api_schemas.jobs import Job
from service.settings import Settings
from service.storage import LocalStorage, parse_job_id
from service.store import JobNotFound, JobStore
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
