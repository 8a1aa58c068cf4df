"""The FastAPI application. Never imports torch or worker code."""

from __future__ import annotations

import importlib
import logging
import pkgutil

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute, iter_route_contexts

import service.api.routes as routes_pkg
from core import metrics, webhooks
from core.db.notify import make_waker
from core.logs import use_json
from core.settings import Settings, get_settings
from core.storage_factory import get_storage
from core.store import JobStore
from service.api.deps import require_job_owner, require_key
from service.api.gate import V1Gate
from service.auth import KeyRing, install_log_redaction
from service.observability import CountedBucket, Observe, StateCollector
from service.queue import TaskQueue, make_client
from service.quotas import Quotas
from service.ratelimit import make_bucket, make_stream_slots
from service.static import mount_web

log = logging.getLogger(__name__)

DESCRIPTION = """Upload a photo (or posed photos), train a neural field on a Celery worker,
then render frames from it. See README.md for a walk-through."""


def _include_routes(app: FastAPI, package=routes_pkg) -> None:
    # Every module in service/api/routes with a `router` is mounted, so new route files
    # need no edit here. One that fails to import stops the API: a half-mounted API would
    # answer 404 where a feature is missing and look healthy.
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        router = getattr(module, "router", None)
        if router is not None:
            private = any(getattr(r, "path", "").startswith("/v1") for r in router.routes)
            app.include_router(router, responses=V1_RESPONSES if private else None)
    _check_guards(app)


def _calls(dependant) -> set:
    out = set()
    for dep in dependant.dependencies:
        out.add(dep.call)
        out |= _calls(dep)
    return out


def api_routes(app: FastAPI) -> list:
    """Every APIRoute as served (included routers flattened), for the guard check and tests."""
    return [
        ctx for ctx in iter_route_contexts(app.routes) if isinstance(ctx.original_route, APIRoute)
    ]


def _check_guards(app: FastAPI) -> None:
    """Every /v1 route declares its API key dependency, and every one with path parameters
    names the job in `{job_id}` and declares the ownership check (service/api/deps.py)."""
    for route in api_routes(app):
        if not route.path.startswith("/v1"):
            continue
        calls = _calls(route.dependant)
        where = f"{sorted(route.methods)} {route.path}"
        if require_key not in calls:
            raise RuntimeError(f"{where} is under /v1 but declares no API key (deps.GUARDS)")
        if route.param_convertors and (
            "job_id" not in route.param_convertors or require_job_owner not in calls
        ):
            raise RuntimeError(
                f"{where} takes path parameters but no owned {{job_id}} (deps.JOB_GUARDS / OWNER)"
            )


V1_RESPONSES = {
    400: {"description": "a body that is not valid JSON / multipart"},
    401: {"description": "no API key, or not a configured one (WWW-Authenticate: Bearer)"},
    404: {"description": "no such job for this API key (another key's job looks the same)"},
    413: {"description": "body over MAX_JSON_BODY_KB (MAX_UPLOAD_MB on the upload)"},
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
    app.state.store = JobStore(  # applies the database migrations
        storage,
        listeners=[webhooks.status_recorder(storage), metrics.status_listener],
        settings=settings,
    )
    app.state.event_waker = make_waker(app.state.store.url)
    app.state.state_collector = StateCollector(app.state.store, settings)
    app.state.queue = TaskQueue(make_client(settings), settings)
    app.state.quotas = Quotas(storage, app.state.store, settings)
    app.state.stream_slots = make_stream_slots(settings)  # MAX_STREAMS_PER_KEY, Redis-shared
    app.state.keys = KeyRing.from_settings(settings)
    renames = {old: new for old, new in app.state.keys.renames.items() if old != new}
    owned = sum(app.state.store.rename_owner(old, new) for old, new in renames.items())
    app.state.quotas.rename_keys(renames)
    if moved := owned:
        log.info("moved %d jobs from unsalted key ids to HMAC key ids (service/auth.py)", moved)
    install_log_redaction()
    if settings.log_format == "json":
        use_json([logging.getLogger(n) for n in ("", "uvicorn", "uvicorn.error", "uvicorn.access")])
    app.state.render_limit = CountedBucket(
        make_bucket(
            settings, settings.render_pixels_per_min, settings.render_pixel_burst, "render-pixels"
        ),
        "RENDER_PIXELS_PER_MIN",
    )
    if not len(app.state.keys):
        log.warning(
            "no API keys configured (API_KEYS / API_KEYS_FILE): every /v1 request will get 401"
        )
    else:
        log.info("API keys loaded: %s", ", ".join(app.state.keys.names))
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(V1Gate, keys=app.state.keys, settings=settings)
    app.add_middleware(Observe)  # outermost: the gate's answers get an id and a duration too
    _include_routes(app)
    mount_web(app)
    app.openapi = _error_schema(app)
    return app


app = create_app()
