"""Transient faults of the job database and of object storage: told apart from a job's own, retried
with backoff by the worker, and described without naming any host.

A database that restarts, refuses connections for a while or drops one, an S3 endpoint that
cannot be reached, times out or answers 5xx / SlowDown: each is `transient`. A job's own fault
(its config, its data, a full disk: the OSErrors of the job's files) is not, and fails the job as
before. `retrying` calls again with exponential backoff until the call succeeds, `stop()` says to
give up (core/leases.py `fenced`: the work's lease was lost), or `deadline_s` passes (the last
error raised).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# S3 error codes that are the service's state, not the request's.
_S3_TRANSIENT = {
    "InternalError",
    "ServiceUnavailable",
    "SlowDown",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "Throttling",
    "ThrottlingException",
    "500",
    "502",
    "503",
    "504",
}


def transient(exc: BaseException) -> bool:
    """The database or object storage failing for a while (not the job's own fault)."""
    from sqlalchemy import exc as sa_exc

    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        # OperationalError: connection refused, dropped, server shutting down, a timeout
        # (statement or lock), the database not accepting connections. SQLite's "disk is full"
        # and "disk I/O error" become OSErrors in core/store.py before they get here.
        return isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError)
    if isinstance(exc, sa_exc.TimeoutError | sa_exc.DisconnectionError):
        return True  # the pool's wait for a connection; a connection that died
    try:
        from botocore import exceptions as boto_exc
    except ImportError:  # the API image without boto
        boto_exc = None
    if boto_exc is not None:
        if isinstance(
            exc,
            boto_exc.EndpointConnectionError
            | boto_exc.ConnectionClosedError
            | boto_exc.ReadTimeoutError
            | boto_exc.ConnectTimeoutError,
        ):
            return True
        if isinstance(exc, boto_exc.ClientError):
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return str(error.get("Code")) in _S3_TRANSIENT or (status or 0) >= 500
    return isinstance(exc, ConnectionError | TimeoutError)


def public_text(exc: BaseException) -> str:
    """What a client may read of an infrastructure error: its kind, never a host, port, user or
    database name (the full text stays in the worker's log)."""
    from sqlalchemy import exc as sa_exc

    if isinstance(exc, sa_exc.SQLAlchemyError):
        orig = getattr(exc, "orig", None)
        kind = type(orig).__name__ if orig is not None else type(exc).__name__
        return f"{type(exc).__name__}: the job database failed ({kind}; its cause is logged)"
    return f"{type(exc).__name__}: storage or the network failed (its cause is logged)"


def retrying(
    fn: Callable[[], T],
    what: str,
    *,
    stop: Callable[[], bool] | None = None,
    on_stop: Callable[[], BaseException] | None = None,
    deadline_s: float = 120.0,
    base_s: float = 0.25,
    max_s: float = 8.0,
) -> T:
    """`fn()`, called again after a transient error with backoff (base_s doubling to max_s,
    jittered) for up to `deadline_s`; `stop()` true between tries ends it with `on_stop()`'s
    exception. Errors that are not transient raise at once."""
    end = time.monotonic() + deadline_s
    delay = base_s
    tries = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            tries += 1
            if not transient(exc) or time.monotonic() + delay > end:
                raise
            log.warning(
                "%s failed (%s, try %d); again in %.1f s",
                what,
                type(exc).__name__,
                tries,
                delay,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
        if stop is not None and stop():
            raise on_stop() if on_stop is not None else RuntimeError(f"{what}: stopped")
        time.sleep(delay * (0.75 + random.random() / 2))
        if stop is not None and stop():
            raise on_stop() if on_stop is not None else RuntimeError(f"{what}: stopped")
        delay = min(delay * 2, max_s)
