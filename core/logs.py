"""Log lines as JSON (LOG_FORMAT=json) and the request id that follows a request from the API
into the Celery tasks it sends (docs/deploy.md, "Metrics and logs").

The API takes `X-Request-ID` from the request (or makes one), answers it in the same header,
and puts it in the headers of every task sent while handling the request (TASK_HEADER); the
worker sets it for the task's run, so the task's log lines carry the request's id."""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar

from pythonjsonlogger.json import JsonFormatter

REQUEST_ID: ContextVar[str | None] = ContextVar("nf_request_id", default=None)
TASK_HEADER = "nf_request_id"
HTTP_HEADER = "X-Request-ID"
# What a client may choose: enough for a UUID or a trace id, nothing that could forge log lines.
_CLIENT_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def put_request_id(headers=None, **_) -> None:
    """Celery's before_task_publish receiver: the current request id goes into the task's
    headers (the API's requests, and a task that sends the next one: preprocess -> train)."""
    rid = REQUEST_ID.get()
    if rid and headers is not None:
        headers[TASK_HEADER] = rid


def request_id_from(value: str | None) -> str:
    """The client's id when it is a plain token, else a new one."""
    if value and _CLIENT_ID.match(value):
        return value
    return uuid.uuid4().hex


class RequestIdFilter(logging.Filter):
    """Adds `request_id` (None outside a request or task) to every record a handler emits."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


def json_formatter() -> logging.Formatter:
    return JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s %(request_id)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger", "process": "pid"},
        timestamp=False,
    )


def use_json(loggers: list[logging.Logger] | None = None) -> None:
    """Every handler of these loggers (default: the root's, or a new stderr handler) writes
    JSON lines with the request id. Idempotent."""
    targets = loggers if loggers is not None else [logging.getLogger()]
    for logger in targets:
        if not logger.handlers and logger is logging.getLogger():
            # Nobody configured the root logger (uvicorn configures only its own): the
            # service's INFO lines would otherwise go nowhere.
            logger.addHandler(logging.StreamHandler())
            logger.setLevel(min(logger.level, logging.INFO))
        for handler in logger.handlers:
            handler.setFormatter(json_formatter())
            if not any(isinstance(f, RequestIdFilter) for f in handler.filters):
                handler.addFilter(RequestIdFilter())
