"""Prometheus metrics shared by the API and the workers (docs/deploy.md, "Metrics and logs").

Counters and histograms are recorded where things happen (status changes in whichever process
writes them, stages in the worker, HTTP requests and quota refusals in the API). With
PROMETHEUS_MULTIPROC_DIR set, every process writes its samples to files there and the API's
`/metrics` adds them all up (prometheus_client's multiprocess mode); it must be set, to a folder
the API and the workers share, before any of them starts. Without it `/metrics` shows the API
process's own samples only. Gauges of state (jobs by status, queue depths) are read at scrape
time from the job store and the broker instead.
"""

from __future__ import annotations

import hmac
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# prometheus_client picks its storage when imported: the folder must exist by then.
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)

from prometheus_client import (  # noqa: E402
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)

from api_schemas.jobs import Job  # noqa: E402

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
if os.environ.get(MULTIPROC_ENV):
    # Sample files are named by process; containers sharing the folder all have small pids
    # (the API and a worker can both be pid 1), so the name is host (container) and pid.
    _HOST = socket.gethostname()
    values.ValueClass = values.MultiProcessValue(lambda: f"{_HOST}-{os.getpid()}")
# Jobs run from seconds (image) to hours (large scenes).
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)
RENDER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

STATUS_CHANGES = Counter(
    "nf_job_status_changes",
    "Job status changes written, by kind and new status",
    ["kind", "status"],
)
JOB_DURATION = Histogram(
    "nf_job_duration_seconds",
    "Submission to a final status (succeeded, failed, cancelled)",
    ["kind", "status"],
    buckets=DURATION_BUCKETS,
)
STAGE_DURATION = Histogram(
    "nf_stage_duration_seconds",
    "One run of a worker stage (sfm: structure from motion, train), however it ended",
    ["kind", "stage"],
    buckets=DURATION_BUCKETS,
)
RENDER_SECONDS = Histogram(
    "nf_render_seconds",
    "Render requests (frames and camera paths) from arrival to answer, at the API",
    ["route", "status"],
    buckets=RENDER_BUCKETS,
)
HTTP_SECONDS = Histogram(
    "nf_http_request_duration_seconds",
    "API requests by route template (event streams count their whole life)",
    ["method", "route", "status"],
    buckets=HTTP_BUCKETS,
)
QUOTA_REFUSALS = Counter(
    "nf_quota_refusals", "Requests refused by a per-key quota or rate limit, by setting", ["limit"]
)
WORKER_HEARTBEAT = Gauge(
    "nf_worker_heartbeat_timestamp_seconds",
    "Last heartbeat of each worker (unix time); a stale one is a worker that stopped",
    ["worker"],
    multiprocess_mode="max",
)
WEBHOOK_ATTEMPTS = Counter(
    "nf_webhook_attempts", "Webhook delivery attempts, by outcome", ["outcome"]
)
_SETTING = re.compile(r"\b((?:QUOTA|RENDER|MAX)_[A-Z_]+)\b")


def quota_refused(detail: str) -> None:
    """Count a refusal under the setting its message names."""
    m = _SETTING.search(detail)
    QUOTA_REFUSALS.labels(m.group(1) if m else "other").inc()


def status_listener(job: Job) -> None:
    """A JobStore listener: every status change, and the job's duration once it ends."""
    STATUS_CHANGES.labels(job.kind.value, job.status.value).inc()
    if job.status.terminal:
        seconds = (job.updated_at - job.created_at).total_seconds()
        JOB_DURATION.labels(job.kind.value, job.status.value).observe(max(seconds, 0.0))


@contextmanager
def stage_timer(kind: str, stage: str) -> Iterator[None]:
    t0 = time.monotonic()
    try:
        yield
    finally:
        STAGE_DURATION.labels(kind, stage).observe(time.monotonic() - t0)


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def exposition(*collectors) -> tuple[bytes, str]:
    """The text format: every process's samples (multiprocess mode) or this one's, plus
    `collectors` read now."""
    registry = CollectorRegistry()
    if multiprocess_dir():
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_Default())
    for c in collectors:
        registry.register(c)
    return generate_latest(registry), CONTENT_TYPE_LATEST


def serve(host: str, port: int, token: str | None = None) -> threading.Thread:
    """Answer GET /metrics on (host, port) from a daemon thread with `exposition()`: a worker
    host's samples, where the API's /metrics cannot read them. With `token`, a request needs
    `Authorization: Bearer <token>` (else 401), as the API's does."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            given = self.headers.get("Authorization", "")
            if token and not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                self.send_response(401)
                self.send_header("WWW-Authenticate", "Bearer")
                self.end_headers()
                return
            body, content_type = exposition()
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # scrapes every few seconds: not worth a line
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="nf-metrics", daemon=True)
    thread.start()
    return thread


class _Default:
    def collect(self):
        yield from REGISTRY.collect()
