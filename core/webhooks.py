"""Webhooks: callback URLs, signing secrets and the delivery log (docs/webhooks.md).

Status changes (JobStore listeners, in whichever process writes them) and finished exports
(the worker) are recorded as deliveries in `<job>/webhooks/<n>.json`, numbered in event order,
and the job is marked in `DATA_DIR/webhooks/pending/`; the train workers' sender
(core/webhook_sender.py) POSTs them. Recording is a small file write, so neither the API nor
a training ever waits on a receiver.

A job's callback URL (`<job>/webhook.json`, from the submission's `callback_url`) wins over its
key's (`DATA_DIR/keys/<key id>/webhook.json`, which also holds the key's signing secret).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import secrets
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from api_schemas.jobs import Job
from api_schemas.webhooks import (
    DeliveryStatus,
    WebhookDelivery,
    WebhookEvent,
    WebhookEventType,
)
from core.exports import ExportNotFound, ExportStore
from core.storage import JobPaths, LocalStorage, atomic_write_json, flock

SIGNATURE_HEADER = "NF-Signature"
EVENT_HEADER = "NF-Event-Id"
MAX_URL_CHARS = 2048
WEBHOOK_FILE = "webhook.json"
OWNER_FILE = "owner"  # written by the API (service/auth.py): the owning key's id
_KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_RECORD = re.compile(r"^(\d{6,})\.json$")


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


# -- per-key settings --------------------------------------------------------------------------
def _key_file(storage: LocalStorage, key_id: str) -> Path:
    if not _KEY_ID.match(key_id):
        raise ValueError("bad key id")
    return storage.data_dir / "keys" / key_id / WEBHOOK_FILE


def key_settings(storage: LocalStorage, key_id: str) -> dict[str, Any]:
    """{"url": str | None, "secret": str | None} of one key."""
    try:
        data = json.loads(_key_file(storage, key_id).read_text())
    except (FileNotFoundError, ValueError):
        data = {}
    return {"url": data.get("url"), "secret": data.get("secret")}


def save_key_settings(storage: LocalStorage, key_id: str, url: str | None, secret: str | None):
    # mkstemp's 0600 mode carries over the rename: only the service's user reads the secret.
    atomic_write_json(_key_file(storage, key_id), {"url": url, "secret": secret})


def owner_key(paths: JobPaths) -> str | None:
    try:
        kid = (paths.root / OWNER_FILE).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return kid if _KEY_ID.match(kid) else None


def set_job_url(paths: JobPaths, url: str) -> None:
    atomic_write_json(paths.root / WEBHOOK_FILE, {"url": url})


def callback_url(storage: LocalStorage, paths: JobPaths) -> str | None:
    try:
        url = json.loads((paths.root / WEBHOOK_FILE).read_text()).get("url")
    except (FileNotFoundError, NotADirectoryError, ValueError):
        url = None
    if url:
        return url
    kid = owner_key(paths)
    return key_settings(storage, kid)["url"] if kid else None


# -- the delivery log ----------------------------------------------------------------------------
def webhooks_dir(paths: JobPaths) -> Path:
    return paths.root / "webhooks"


def pending_dir(storage: LocalStorage) -> Path:
    return storage.data_dir / "webhooks" / "pending"


def mark_pending(storage: LocalStorage, job_id: str) -> None:
    folder = pending_dir(storage)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / job_id).touch()


def record_files(paths: JobPaths) -> list[Path]:
    folder = webhooks_dir(paths)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _RECORD.match(p.name))]
    return [p for _, p in sorted(found)]


def read_record(path: Path) -> WebhookDelivery:
    return WebhookDelivery.model_validate_json(path.read_bytes())


def write_record(path: Path, delivery: WebhookDelivery) -> None:
    atomic_write_json(path, delivery.model_dump(mode="json"))


def deliveries(paths: JobPaths) -> list[WebhookDelivery]:
    out = []
    for p in record_files(paths):
        try:
            out.append(read_record(p))
        except (FileNotFoundError, ValueError):
            continue
    return out


def record_event(
    storage: LocalStorage, job_id: str, type_: WebhookEventType, data: dict[str, Any]
) -> WebhookDelivery | None:
    """Log one event for delivery when the job has a callback URL (None otherwise)."""
    paths = storage.paths(job_id)
    if not paths.root.is_dir():
        return None
    url = callback_url(storage, paths)
    if not url:
        return None
    folder = webhooks_dir(paths)
    folder.mkdir(exist_ok=True)
    # Numbered under a lock: the number is the order receivers get the events in.
    with flock(folder / ".lock"):
        files = record_files(paths)
        n = int(_RECORD.match(files[-1].name).group(1)) + 1 if files else 1
        delivery = WebhookDelivery(
            id=f"{n:06d}",
            url=url,
            event=WebhookEvent(
                id=f"{job_id}.{n}",
                type=type_,
                created_at=datetime.now(UTC),
                job_id=job_id,
                data=data,
            ),
            status=DeliveryStatus.pending,
        )
        write_record(folder / f"{n:06d}.json", delivery)
    mark_pending(storage, job_id)
    return delivery


def status_data(job: Job) -> dict[str, Any]:
    return {
        "kind": job.kind.value,
        "status": job.status.value,
        "error": job.error,
        "metrics": job.metrics,
        "updated_at": job.updated_at.isoformat(),
    }


def status_recorder(storage: LocalStorage):
    """A JobStore listener that logs every status change for delivery."""

    def on_status(job: Job) -> None:
        record_event(storage, job.id, WebhookEventType.job_status, status_data(job))

    return on_status


def record_export(storage: LocalStorage, job_id: str, export_id: str) -> None:
    """Log a finished export once (a redelivered export task finds it already logged)."""
    try:
        export = ExportStore(storage).get(job_id, export_id)
    except (ExportNotFound, ValueError):
        return
    if export.status.value not in ("succeeded", "failed"):
        return
    data = export.model_dump(mode="json")
    for d in deliveries(storage.paths(job_id)):
        if d.event.type == WebhookEventType.export_finished and d.event.data == data:
            return
    record_event(storage, job_id, WebhookEventType.export_finished, data)
