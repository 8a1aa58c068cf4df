"""Sends the logged webhook deliveries (core/webhooks.py): a thread in each train worker's main
process, never in a pool process, so a slow receiver holds up no training and no request.

Each round asks the delivery log (core/webhooks.py) which jobs have a pending delivery that is
due, and hands each to a small thread pool. A job's deliveries go out one at a time, in event
order, under the job's `webhook` lease (core/leases.py: senders on any number of hosts; one of
them sends a given job). A failed attempt is retried after
WEBHOOK_RETRY_BASE_S * 2^(n-1) seconds, up to WEBHOOK_MAX_ATTEMPTS, and later events of that job
wait behind it, so a receiver never sees `succeeded` before `running`. The URL is resolved and
checked again before each attempt, and the request goes to the address that was checked (a DNS
answer that changes between check and connect cannot point it at a private address)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx

from api_schemas.webhooks import DeliveryStatus, WebhookAttempt, WebhookDelivery
from core import leases, metrics, webhooks
from core.db.engine import session
from core.settings import Settings

log = logging.getLogger(__name__)
POLL_S = 0.25
SENDERS = 4  # jobs delivered at once per worker
MAX_RETRY_DELAY_S = 3600.0
USER_AGENT = "nf-webhooks/1"
WEBHOOK = "webhook"  # the lease kind a job's sender holds
LEASE_TTL_S = 60.0


def retry_delay(settings: Settings, attempts: int) -> float:
    """Seconds between attempt `attempts` and the next one."""
    return min(settings.webhook_retry_base_s * 2 ** (attempts - 1), MAX_RETRY_DELAY_S)


def attempt(delivery: WebhookDelivery, secret: str | None, settings: Settings) -> WebhookAttempt:
    """One POST of the delivery's event; never raises."""
    at, t0 = datetime.now(UTC), time.monotonic()

    def result(status_code: int | None = None, error: str | None = None) -> WebhookAttempt:
        ms = round((time.monotonic() - t0) * 1000, 1)
        return WebhookAttempt(at=at, status_code=status_code, error=error, duration_ms=ms)

    if not secret:
        return result(error="the key has no signing secret (POST /v1/webhook/secret)")
    try:
        url, ips = webhooks.check_url(delivery.url, settings.webhook_allow_private)
    except webhooks.WebhookURLError as exc:
        return result(error=f"refused: {exc}")
    body = delivery.event.model_dump_json().encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Host": url.netloc.decode("ascii"),
        webhooks.SIGNATURE_HEADER: webhooks.signature(secret, int(time.time()), body),
        webhooks.EVENT_HEADER: delivery.event.id,
    }
    # Connect to the address just checked; TLS still verifies the certificate for the name.
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    target = url.copy_with(host=ips[0])
    try:
        code = asyncio.run(_post(target, body, headers, extensions, settings.webhook_timeout_s))
    except TimeoutError:
        return result(
            error=f"no answer within {settings.webhook_timeout_s:g} s (WEBHOOK_TIMEOUT_S)"
        )
    except httpx.HTTPError as exc:
        return result(error=f"{type(exc).__name__}: {exc}"[:300])
    return result(code) if 200 <= code < 300 else result(code, f"HTTP {code}")


async def _post(
    url: httpx.URL, body: bytes, headers: dict, extensions: dict, limit_s: float
) -> int:
    """The receiver's status code. `limit_s` bounds the whole attempt (httpx's timeouts are per
    read, so a receiver trickling its answer could otherwise hold a sender thread for good);
    the answer's body is never read."""

    async def post() -> int:
        async with httpx.AsyncClient(
            timeout=limit_s, follow_redirects=False, trust_env=False
        ) as client:
            req = client.build_request(
                "POST", url, content=body, headers=headers, extensions=extensions
            )
            response = await client.send(req, stream=True)
            await response.aclose()
            return response.status_code

    return await asyncio.wait_for(post(), limit_s)


def send_job(storage, job_id: str, settings: Settings) -> float | None:
    """Deliver what is due for one job, in order; stop at the first delivery that must wait.
    Returns the seconds until that one is due (None: nothing left to wait for here)."""
    db = webhooks.db_settings(storage, settings)
    with leases.held(db, WEBHOOK, job_id, LEASE_TTL_S, job_id=job_id, count=False) as mine:
        if mine is None:
            return None
        kid = webhooks.owner_key(storage, job_id)
        for delivery in webhooks.deliveries(job_id, storage):
            if delivery.status != DeliveryStatus.pending:
                continue
            now = datetime.now(UTC)
            if delivery.next_attempt_at is not None and delivery.next_attempt_at > now:
                return (delivery.next_attempt_at - now).total_seconds()
            secret = webhooks.key_settings(storage, kid)["secret"] if kid else None
            result = attempt(delivery, secret, settings)
            metrics.WEBHOOK_ATTEMPTS.labels("delivered" if result.error is None else "failed").inc()
            delivery.attempts.append(result)
            n = len(delivery.attempts)
            if result.error is None:
                delivery.status, delivery.next_attempt_at = DeliveryStatus.delivered, None
            elif n >= settings.webhook_max_attempts:
                delivery.status, delivery.next_attempt_at = DeliveryStatus.failed, None
                log.warning(
                    "webhook %s of job %s failed after %d attempts: %s",
                    delivery.id,
                    job_id,
                    n,
                    result.error,
                )
            else:
                delivery.next_attempt_at = datetime.now(UTC) + timedelta(
                    seconds=retry_delay(settings, n)
                )
            with session(db, write=True) as s:
                webhooks.save_delivery(s, job_id, delivery)
            if delivery.status == DeliveryStatus.pending:
                return retry_delay(settings, n)
    return None


class Sender:
    def __init__(self, storage, settings: Settings):
        self.storage, self.settings = storage, settings
        self.db = webhooks.db_settings(storage, settings)
        self.pool = ThreadPoolExecutor(SENDERS, thread_name_prefix="nf-webhook")
        self.busy: set[str] = set()
        self.lock = threading.Lock()

    def _run(self, job_id: str) -> None:
        try:
            send_job(self.storage, job_id, self.settings)
        except Exception:
            log.exception("webhook delivery for job %s failed", job_id)
        finally:
            with self.lock:
                self.busy.discard(job_id)

    def round(self) -> None:
        # Only due deliveries are asked for: a job waiting out a backoff is not read again.
        for job_id in webhooks.due_jobs(self.db):
            with self.lock:
                if job_id in self.busy:
                    continue
                self.busy.add(job_id)
            self.pool.submit(self._run, job_id)

    def loop(self) -> None:
        while True:
            try:
                self.round()
            except Exception:
                log.exception("webhook sender round failed")
            time.sleep(POLL_S)


def start_sender(storage, settings: Settings) -> threading.Thread:
    thread = threading.Thread(
        target=Sender(storage, settings).loop, name="nf-webhook-sender", daemon=True
    )
    thread.start()
    return thread
