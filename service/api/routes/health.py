"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from core.storage import LocalStorage
from service.api.deps import get_queue, get_storage
from service.intake.registry import available_kinds
from service.queue import TaskQueue

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The API process is alive")
def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz", summary="Broker reachable and storage writable")
def readyz(storage: LocalStorage = Depends(get_storage), queue: TaskQueue = Depends(get_queue)):
    checks = {"broker": queue.ping(), "storage": storage.writable()}
    ok = all(checks.values())
    return JSONResponse(
        {"status": "ok" if ok else "unavailable", "checks": checks, "kinds": available_kinds()},
        status_code=200 if ok else 503,
    )
