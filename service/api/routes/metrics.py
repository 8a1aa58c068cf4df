"""GET /metrics: Prometheus' text format (core/metrics.py). Outside /v1: a scraper holds no
tenant key. It shows counts and durations only (no job ids, key names or URLs); an operator who
exposes the port sets METRICS_TOKEN and gives the scraper `Authorization: Bearer <token>`."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool

from core import metrics
from service.auth import bearer_token

router = APIRouter(tags=["operations"])


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(request: Request) -> Response:
    token = request.app.state.settings.metrics_token
    if token:
        given = bearer_token(request.headers.get("authorization")) or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(
                401,
                "/metrics wants `Authorization: Bearer <METRICS_TOKEN>`",
                headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
            )
    body, content_type = await run_in_threadpool(
        metrics.exposition, request.app.state.state_collector
    )
    return Response(body, media_type=content_type)
