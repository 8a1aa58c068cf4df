"""The API's side of metrics and request ids: the middleware that times every request and
carries X-Request-ID, the Celery hook that puts the id into every task sent, and the gauges
read at scrape time (core/metrics.py has the rest)."""

from __future__ import annotations

import logging
import os
import time

from celery.signals import before_task_publish
from prometheus_client.core import GaugeMetricFamily

from core import metrics, webhooks
from core.celery_config import PREPROCESS_QUEUE, RENDER_QUEUE, TRAIN_QUEUE, broker_dirs
from core.logs import HTTP_HEADER, REQUEST_ID, put_request_id, request_id_from
from core.settings import Settings
from core.store import JobStore

log = logging.getLogger(__name__)
QUEUES = (TRAIN_QUEUE, RENDER_QUEUE, PREPROCESS_QUEUE)
SCRAPE_CACHE_S = 5.0  # a scraper polling fast reads the job store at most this often


class Observe:
    """Pure ASGI (a streamed answer, such as the event stream, passes through untouched):
    X-Request-ID in and out, and each request's duration under its route template."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((v for k, v in scope["headers"] if k == b"x-request-id"), b"")
        rid = request_id_from(given.decode("latin-1"))
        token = REQUEST_ID.set(rid)
        t0, status = time.perf_counter(), [500]

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = [
                    *message.get("headers", []),
                    (HTTP_HEADER.lower().encode(), rid.encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
            # The template, never the raw path: job ids would make a series per job.
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            seconds = time.perf_counter() - t0
            code = str(status[0])
            metrics.HTTP_SECONDS.labels(scope["method"], route, code).observe(seconds)
            if route.endswith(("/render", "/render/path")):
                metrics.RENDER_SECONDS.labels(route, code).observe(seconds)


before_task_publish.connect(put_request_id)


class CountedBucket:
    """A rate-limit bucket whose refusals count in nf_quota_refusals_total."""

    def __init__(self, bucket, limit: str):
        self.bucket, self.limit = bucket, limit

    async def take(self, key: str, cost: float = 1.0) -> float:
        wait = await self.bucket.take(key, cost)
        if wait > 0:
            metrics.QUOTA_REFUSALS.labels(self.limit).inc()
        return wait

    def __getattr__(self, name):
        return getattr(self.bucket, name)


class StateCollector:
    """nf_jobs{kind,status} from the job store, nf_queue_depth{queue} from the broker and
    nf_webhook_jobs_pending from the webhook marks."""

    def __init__(self, store: JobStore, settings: Settings):
        self.store, self.settings = store, settings
        self._cached: tuple[float, list] = (0.0, [])

    def collect(self):
        now = time.monotonic()
        if now - self._cached[0] > SCRAPE_CACHE_S:
            self._cached = (now, [self._jobs(), self._queues(), self._webhooks()])
        yield from self._cached[1]

    def _jobs(self) -> GaugeMetricFamily:
        tally = self.store.counts()  # one GROUP BY, not a read of every job
        g = GaugeMetricFamily("nf_jobs", "Jobs by kind and status", labels=["kind", "status"])
        for (kind, status), n in sorted(tally.items()):
            g.add_metric([kind, status], n)
        return g

    def _webhooks(self) -> GaugeMetricFamily:
        n = webhooks.pending_jobs(self.store.storage)
        return GaugeMetricFamily(
            "nf_webhook_jobs_pending", "Jobs with webhook deliveries still to send", value=n
        )

    def _queues(self) -> GaugeMetricFamily:
        g = GaugeMetricFamily(
            "nf_queue_depth", "Messages waiting in each broker queue", labels=["queue"]
        )
        try:
            depths = self._depths()
        except Exception as exc:
            log.warning("queue depths unavailable: %s", type(exc).__name__)
            return g
        for q in QUEUES:
            g.add_metric([q], depths.get(q, 0))
        return g

    def _depths(self) -> dict[str, int]:
        if self.settings.redis_url:
            import redis

            r = redis.Redis.from_url(self.settings.redis_url, socket_timeout=2)
            out = {}
            for q in QUEUES:
                # kombu keeps one list per priority: "train", "train\x06\x163", ...
                names = [
                    n
                    for n in r.scan_iter(match=q + "*", count=100)
                    if n == q.encode() or n.startswith(q.encode() + b"\x06\x16")
                ]
                out[q] = sum(r.llen(n) for n in names)
            return out
        folder = broker_dirs(self.settings)["queue"]
        out = dict.fromkeys(QUEUES, 0)
        for name in os.listdir(folder):
            parts = name.rsplit(".", 2)
            if len(parts) == 3 and parts[2] == "msg" and parts[1] in out and name[0] != ".":
                out[parts[1]] += 1
        return out
