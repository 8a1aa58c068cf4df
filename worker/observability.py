"""The worker's side of logs and metrics: JSON log lines (LOG_FORMAT=json) carrying the request
id the API put in the task's headers, a heartbeat gauge per worker, and with
WORKER_METRICS_PORT the host's samples on /metrics (core/logs.py, core/metrics.py)."""

from __future__ import annotations

import logging
import threading
import time

from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    before_task_publish,
    task_postrun,
    task_prerun,
    worker_ready,
)

from core import metrics
from core.logs import REQUEST_ID, TASK_HEADER, put_request_id, use_json
from core.settings import get_settings

log = logging.getLogger(__name__)
HEARTBEAT_S = 5.0
before_task_publish.connect(put_request_id)


@after_setup_logger.connect
@after_setup_task_logger.connect
def _json_lines(logger=None, **_):
    if get_settings().log_format == "json" and logger is not None:
        use_json([logger])


@task_prerun.connect
def _task_request_id(task_id=None, task=None, **_):
    rid = getattr(task.request, TASK_HEADER, None) if task is not None else None
    REQUEST_ID.set(rid if isinstance(rid, str) else None)
    log.info("%s[%s] started", getattr(task, "name", "task"), task_id)


@task_postrun.connect
def _task_done(**_):
    REQUEST_ID.set(None)


@worker_ready.connect
def _serve_metrics(**_):
    settings = get_settings()
    if settings.worker_metrics_port:
        metrics.serve(
            settings.worker_metrics_host, settings.worker_metrics_port, settings.metrics_token
        )
        log.info(
            "metrics on %s:%d/metrics", settings.worker_metrics_host, settings.worker_metrics_port
        )


@worker_ready.connect
def _start_heartbeat(sender=None, **_):
    name = getattr(sender, "hostname", None) or "worker"
    gauge = metrics.WORKER_HEARTBEAT.labels(name)

    def beat() -> None:
        while True:
            gauge.set(time.time())
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=beat, name="nf-heartbeat", daemon=True).start()
