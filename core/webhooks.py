"""Webhooks: callback URLs, signing secrets and the delivery log (docs/webhooks.md).

Status changes and finished exports are recorded as rows of `webhook_deliveries`
(core/db/webhooks.py), numbered per job in event order; the train workers' sender
(core/webhook_sender.py) POSTs the pending ones, and a row stays until it is sent (or failed
after its attempts). A status change's row is inserted in the status change's own transaction
(`status_recorder`, a JobStore listener run inside it: an outbox), so a process dying right after
the change cannot lose its event: both are committed or neither. Numbering happens under the
job row's lock (the status change holds it; `record_event` takes it), so the two never race for
a number. Recording is one small insert, so neither the API nor a training ever waits on a
receiver.

A job's callback URL (`webhook_jobs`, from the submission's `callback_url`) wins over its key's
(`webhook_keys`, which also holds the key's signing secret); the job's key is its owner.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import socket
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from api_schemas.jobs import Job
from api_schemas.webhooks import (
    DeliveryStatus,
    WebhookDelivery,
    WebhookEvent,
    WebhookEventType,
)
from core.db import migrate
from core.db.engine import database_url, session
from core.db.jobs import JobRow
from core.db.webhooks import WebhookDeliveryRow, WebhookJob, WebhookKey
from core.exports import ExportNotFound, ExportStore
from core.storage import JobPaths

SIGNATURE_HEADER = "NF-Signature"
EVENT_HEADER = "NF-Event-Id"
MAX_URL_CHARS = 2048
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class WebhookURLError(ValueError):
    """A callback URL that is refused; the message says why (the API answers it as a 422)."""


# -- signing ---------------------------------------------------------------------------------
def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The header value: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">` (Stripe's
    scheme: the timestamp is signed too, so an old delivery cannot be replayed later)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, header: str, body: bytes, tolerance_s: float = 300, now=None) -> bool:
    """What a receiver does: recompute the MAC over the raw body, compare in constant time, and
    refuse timestamps further than `tolerance_s` from its clock."""
    pairs = [p.split("=", 1) for p in header.split(",") if "=" in p]
    try:
        ts = int(next(v for k, v in pairs if k.strip() == "t"))
    except (StopIteration, ValueError):
        return False
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    expected = signature(secret, ts, body).split("v1=", 1)[1]
    return any(hmac.compare_digest(expected, v) for k, v in pairs if k.strip() == "v1")


# -- URLs ------------------------------------------------------------------------------------
def _refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_private: bool) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    # Never: these reach no receiver (0.0.0.0 connects to this very host).
    if ip.is_unspecified or ip.is_multicast:
        return "an unspecified or multicast"
    if ip.is_loopback:
        kind = "a loopback"
    elif ip.is_link_local:
        kind = "a link-local"
    elif ip.is_private:
        kind = "a private"
    elif not ip.is_global:
        kind = "a non-public"
    else:
        return None
    return None if allow_private else kind


def check_url(url: str, allow_private: bool) -> tuple[httpx.URL, list[str]]:
    """Parse and resolve a callback URL; returns it with the addresses it may be sent to.
    Raises WebhookURLError when it is malformed, does not resolve, or resolves to any address
    that is not public (loopback, private, link-local) unless `allow_private`. Called at
    submission and again before every attempt (a name may resolve elsewhere by then)."""
    if len(url) > MAX_URL_CHARS:
        raise WebhookURLError(f"callback URL is longer than {MAX_URL_CHARS} characters")
    try:
        u = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise WebhookURLError(f"callback URL is not a valid URL ({exc})") from None
    if u.scheme not in ("http", "https") or not u.host:
        raise WebhookURLError("callback URL must be an absolute http:// or https:// URL")
    if u.userinfo:
        raise WebhookURLError("callback URL must not carry a user name or password")
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(u.host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as exc:  # gaierror; a NUL; a label too long
        raise WebhookURLError(f"callback host {u.host!r} does not resolve ({exc})") from None
    ips = list(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))
    for raw in ips:
        reason = _refusal(ipaddress.ip_address(raw), allow_private)
        if reason:
            raise WebhookURLError(
                f"callback host {u.host!r} resolves to {raw}, {reason} address; callbacks go "
                "to public addresses only (the operator's WEBHOOK_ALLOW_PRIVATE=true allows it)"
            )
    if not ips:
        raise WebhookURLError(f"callback host {u.host!r} does not resolve")
    return u, ips


# -- where the rows are ------------------------------------------------------------------------
def db_settings(storage=None, settings=None):
    """`settings`, else the process's, on the storage's DATA_DIR when no DATABASE_URL is set
    (the database JobStore uses)."""
    if settings is not None:
        return settings
    from core.settings import get_settings

    settings = get_settings()
    data_dir = getattr(storage, "data_dir", None)
    if not settings.database_url and data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
        migrate.ensure(database_url(settings))
    return settings


def _job_id(paths: JobPaths | str) -> str:
    return paths if isinstance(paths, str) else paths.root.name


# -- per-key settings --------------------------------------------------------------------------
def key_settings(storage, key_id: str) -> dict[str, Any]:
    """{"url": str | None, "secret": str | None} of one key."""
    if not _KEY_ID.match(key_id):
        raise ValueError("bad key id")
    with session(db_settings(storage)) as s:
        row = s.get(WebhookKey, key_id)
        return {"url": row.url if row else None, "secret": row.secret if row else None}


def save_key_settings(storage, key_id: str, url: str | None, secret: str | None) -> None:
    if not _KEY_ID.match(key_id):
        raise ValueError("bad key id")
    with session(db_settings(storage), write=True) as s:
        row = s.get(WebhookKey, key_id, with_for_update=True)
        if row is None:
            s.add(WebhookKey(owner=key_id, url=url, secret=secret))
        else:
            row.url, row.secret = url, secret


def owner_key(storage, job_id: str) -> str | None:
    with session(db_settings(storage)) as s:
        kid = s.scalar(select(JobRow.owner).where(JobRow.id == job_id))
    return kid if kid and _KEY_ID.match(kid) else None


def set_job_url(paths: JobPaths | str, url: str, storage) -> None:
    """Keep a submission's callback URL with its job (`paths`: the job's folder or id)."""
    job_id = _job_id(paths)
    with session(db_settings(storage), write=True) as s:
        row = s.get(WebhookJob, job_id, with_for_update=True)
        if row is None:
            s.add(WebhookJob(job_id=job_id, url=url))
        else:
            row.url = url


def callback_url(storage, job_id: str) -> str | None:
    with session(db_settings(storage)) as s:
        return _callback_url(s, job_id)


def _callback_url(s, job_id: str) -> str | None:
    url = s.scalar(select(WebhookJob.url).where(WebhookJob.job_id == job_id))
    if url:
        return url
    kid = s.scalar(select(JobRow.owner).where(JobRow.id == job_id))
    if not kid:
        return None
    return s.scalar(select(WebhookKey.url).where(WebhookKey.owner == kid))


# -- the delivery log ----------------------------------------------------------------------------
def to_delivery(row: WebhookDeliveryRow) -> WebhookDelivery:
    return WebhookDelivery(
        id=f"{row.seq:06d}",
        url=row.url,
        event=WebhookEvent.model_validate(row.event),
        status=row.status,
        attempts=row.attempts or [],
        next_attempt_at=row.next_attempt_at,
    )


def save_delivery(s, job_id: str, delivery: WebhookDelivery) -> None:
    """Write back a delivery's outcome (inside the caller's transaction)."""
    row = s.get(WebhookDeliveryRow, (job_id, int(delivery.id)))
    row.status = delivery.status.value
    row.attempts = [a.model_dump(mode="json") for a in delivery.attempts]
    row.next_attempt_at = delivery.next_attempt_at


def deliveries(paths: JobPaths | str, storage) -> list[WebhookDelivery]:
    """The job's deliveries in event order (`paths`: the job's folder or id)."""
    with session(db_settings(storage)) as s:
        rows = s.scalars(
            select(WebhookDeliveryRow)
            .where(WebhookDeliveryRow.job_id == _job_id(paths))
            .order_by(WebhookDeliveryRow.seq)
        ).all()
        return [to_delivery(r) for r in rows]


def due_jobs(settings, now: datetime | None = None, limit: int = 1000) -> list[str]:
    """Jobs with a pending delivery that is due (through the status index)."""
    now = now or datetime.now(UTC)
    with session(settings) as s:
        return list(
            s.scalars(
                select(WebhookDeliveryRow.job_id)
                .where(
                    WebhookDeliveryRow.status == DeliveryStatus.pending.value,
                    (WebhookDeliveryRow.next_attempt_at.is_(None))
                    | (WebhookDeliveryRow.next_attempt_at <= now),
                )
                .distinct()
                .limit(limit)
            ).all()
        )


def pending_jobs(storage=None, settings=None) -> int:
    """Jobs with deliveries still to send (due or waiting out a backoff)."""
    with session(db_settings(storage, settings)) as s:
        return int(
            s.scalar(
                select(func.count(func.distinct(WebhookDeliveryRow.job_id))).where(
                    WebhookDeliveryRow.status == DeliveryStatus.pending.value
                )
            )
            or 0
        )


def record_event(
    storage, job_id: str, type_: WebhookEventType, data: dict[str, Any]
) -> WebhookDelivery | None:
    """Log one event for delivery when the job has a callback URL (None otherwise), in a
    transaction of its own that holds the job's row (as a status change does)."""
    if not callback_url(storage, job_id):
        return None
    for attempt in range(10):
        try:
            with session(db_settings(storage), write=True) as s:
                s.execute(select(JobRow.id).where(JobRow.id == job_id).with_for_update())
                url = _callback_url(s, job_id)
                if not url:
                    return None
                return to_delivery(_insert(s, job_id, type_, data, url))
        except IntegrityError:  # a writer that did not take the job's row (an older version)
            if attempt == 9:
                raise
    return None


def _insert(
    s, job_id: str, type_: WebhookEventType, data: dict[str, Any], url: str
) -> WebhookDeliveryRow:
    # Numbered in the transaction that inserts it: the number is the order receivers get the
    # events in.
    n = (
        s.scalar(
            select(func.max(WebhookDeliveryRow.seq)).where(WebhookDeliveryRow.job_id == job_id)
        )
        or 0
    ) + 1
    now = datetime.now(UTC)
    event = WebhookEvent(id=f"{job_id}.{n}", type=type_, created_at=now, job_id=job_id, data=data)
    row = WebhookDeliveryRow(
        job_id=job_id,
        seq=n,
        url=url,
        event=event.model_dump(mode="json"),
        status=DeliveryStatus.pending.value,
        attempts=[],
        next_attempt_at=None,
        created_at=now,
    )
    s.add(row)
    s.flush()
    return row


def status_data(job: Job) -> dict[str, Any]:
    return {
        "kind": job.kind.value,
        "status": job.status.value,
        "error": job.error,
        "metrics": job.metrics,
        "updated_at": job.updated_at.isoformat(),
    }


class StatusOutbox:
    """A JobStore listener that logs every status change for delivery inside the change's own
    transaction (`in_transaction`, called by JobStore with its session and the job row locked);
    nothing is left to do once it has committed."""

    def __init__(self, storage):
        self.storage = storage

    def in_transaction(self, s, job: Job) -> None:
        url = _callback_url(s, job.id)
        if url:
            _insert(s, job.id, WebhookEventType.job_status, status_data(job), url)

    def __call__(self, job: Job) -> None:
        pass


def status_recorder(storage) -> StatusOutbox:
    """The JobStore listener that logs every status change for delivery (an outbox)."""
    return StatusOutbox(storage)


def record_export(storage, job_id: str, export_id: str) -> None:
    """Log a finished export once (a redelivered export task finds it already logged)."""
    try:
        export = ExportStore(storage).get(job_id, export_id)
    except (ExportNotFound, ValueError):
        return
    if export.status.value not in ("succeeded", "failed"):
        return
    data = export.model_dump(mode="json")
    for d in deliveries(job_id, storage):
        if d.event.type == WebhookEventType.export_finished and d.event.data == data:
            return
    record_event(storage, job_id, WebhookEventType.export_finished, data)
