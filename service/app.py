"""The FastAPI application. Never imports torch or worker code."""

from __future__ import annotations

import importlib
import logging
import pkgutil

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

import service.api.routes as routes_pkg
from core.settings import Settings, get_settings
from core.storage import get_storage
from core.store import JobStore
from service.api.deps import V1_DEPENDENCIES
from service.api.upload_limit import UploadLimitMiddleware
from service.auth import KeyRing, install_log_redaction
from service.queue import TaskQueue, make_client
from service.ratelimit import TokenBucket
from service.static import mount_web

log = logging.getLogger(__name__)

DESCRIPTION = """Upload a photo (or posed photos), train a neural field on a Celery worker,
then render frames from it. See README.md for a walk-through."""


def _include_routes(app: FastAPI) -> None:
    # Every module in service/api/routes with a `router` is mounted, so new route files
    # (events, ...) need no edit here. A broken one is logged, not fatal for the rest.
    for info in sorted(pkgutil.iter_modules(routes_pkg.__path__), key=lambda m: m.name):
        name = f"{routes_pkg.__name__}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception:
            log.exception("route module %s failed to import; skipped", name)
            continue
        router = getattr(module, "router", None)
        if router is not None:
            # Every /v1 route needs an API key, and a {job_id} must belong to it (service/auth.py).
            private = any(getattr(r, "path", "").startswith("/v1") for r in router.routes)
            app.include_router(
                router,
                dependencies=V1_DEPENDENCIES if private else None,
                responses=V1_RESPONSES if private else None,
            )


V1_RESPONSES = {
    400: {"description": "a body that is not valid JSON / multipart"},
    401: {"description": "no API key, or not a configured one (WWW-Authenticate: Bearer)"},
    404: {"description": "no such job for this API key (another key's job looks the same)"},
}


def _readable(errors) -> tuple[str, list[dict]]:
    parts, clean = [], []
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path")]
        parts.append(f"{'.'.join(loc) or 'request'}: {e.get('msg', 'invalid')}")
        clean.append({"loc": loc, "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))})
    return "; ".join(parts), clean


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # One readable string in `detail`, like every other error here; the list stays in `errors`.
    detail, errors = _readable(exc.errors())
    return JSONResponse({"detail": detail, "errors": errors}, status_code=422)


def _error_schema(app: FastAPI):
    """The OpenAPI document, with 422 bodies as they really are (see _validation_error)."""
    base = FastAPI.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            spec = base(app)
            spec.setdefault("components", {}).setdefault("schemas", {})["HTTPValidationError"] = {
                "title": "HTTPValidationError",
                "type": "object",
                "required": ["detail"],
                "properties": {
                    "detail": {"type": "string", "description": "readable summary"},
                    "errors": {
                        "type": "array",
                        "items": {"type": "object"},
                        "description": "one entry per problem: loc, msg, type",
                    },
                },
            }
            app.openapi_schema = spec
        return app.openapi_schema

    return openapi


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(title="Neural-field service", version="1.0", description=DESCRIPTION)
    storage = get_storage(settings)
    storage.ensure()
    app.state.settings = settings
    app.state.storage = storage
    app.state.store = JobStore(storage)
    app.state.queue = TaskQueue(make_client(settings), settings)
    app.state.keys = KeyRing.from_settings(settings)
    install_log_redaction()
    app.state.render_limit = TokenBucket(settings.render_rate_per_min, settings.render_burst)
    if not len(app.state.keys):
        log.warning(
            "no API keys configured (API_KEYS / API_KEYS_FILE): every /v1 request will get 401"
        )
    else:
        log.info("API keys loaded: %s", ", ".join(app.state.keys.names))
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(UploadLimitMiddleware, max_bytes=settings.max_upload_bytes)
    _include_routes(app)
    mount_web(app)
    app.openapi = _error_schema(app)
    return app


app = create_app()
