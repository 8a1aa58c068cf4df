"""Liveness and readiness probes."""

from __future__ import annotations

import threading
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from core.storage import Storage
from service.api.deps import QueueDep, StorageDep
from service.intake.registry import available_kinds
from service.queue import TaskQueue

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The API process is alive")
def healthz() -> dict:
    return {"status": "ok"}


# /readyz needs no key: without a cache every call would fsync a file and open a broker
# connection. Concurrent calls wait for the one check in flight and share its answer.
READY_CACHE_S = 1.0
_ready_lock = threading.Lock()
_ready: dict[int, tuple[float, dict[str, bool]]] = {}  # id(app) -> (checked at, checks)


def _checks(app, storage: Storage, queue: TaskQueue) -> dict[str, bool]:
    with _ready_lock:
        at, checks = _ready.get(id(app), (float("-inf"), {}))
        if time.monotonic() - at >= READY_CACHE_S:
            checks = {"broker": queue.ping(), "storage": storage.writable()}
            _ready[id(app)] = (time.monotonic(), checks)
        return checks


@router.get(
    "/readyz", summary="Broker reachable and storage writable (checked at most once a second)"
)
def readyz(request: Request, storage: StorageDep, queue: QueueDep):
    checks = _checks(request.app, storage, queue)
    ok = all(checks.values())
    return JSONResponse(
        {"status": "ok" if ok else "unavailable", "checks": checks, "kinds": available_kinds()},
        status_code=200 if ok else 503,
    )
