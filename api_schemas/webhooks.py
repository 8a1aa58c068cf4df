"""Webhook wire types: what a callback receives, the delivery log, and a key's webhook settings
(docs/webhooks.md)."""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field


class WebhookEventType(str, Enum):
    job_status = "job.status"  # every status change, the first `queued` included
    export_finished = "export.finished"  # an export ended: succeeded or failed


class WebhookEvent(BaseModel):
    """The JSON body POSTed to the callback URL."""

    id: str = Field(description="`<job id>.<n>`: the same on every retry of one event (dedupe)")
    type: WebhookEventType
    created_at: datetime
    job_id: str
    data: dict[str, Any] = Field(
        description="job.status: kind, status, error, metrics, updated_at; "
        "export.finished: the Export"
    )


class DeliveryStatus(str, Enum):
    pending = "pending"  # not yet delivered; `next_attempt_at` says when it is tried again
    delivered = "delivered"  # a 2xx answer
    failed = "failed"  # WEBHOOK_MAX_ATTEMPTS attempts without a 2xx answer


class WebhookAttempt(BaseModel):
    at: datetime
    status_code: int | None = Field(None, description="the receiver's HTTP status, if it answered")
    error: str | None = Field(None, description="why the attempt failed (none when it succeeded)")
    duration_ms: float


class WebhookDelivery(BaseModel):
    id: str = Field(description="delivery number within the job, in event order")
    event: WebhookEvent
    url: str = Field(
        description="the callback URL when the event happened (the job's, else the key's)"
    )
    status: DeliveryStatus = DeliveryStatus.pending
    attempts: list[WebhookAttempt] = Field(default_factory=list)
    next_attempt_at: datetime | None = None


class WebhookDeliveryList(BaseModel):
    items: list[WebhookDelivery]


class KeyWebhookUpdate(BaseModel):
    """`PUT /v1/webhook`: the key's default callback URL (null removes it)."""

    model_config = {"extra": "forbid"}
    url: str | None = Field(None, max_length=2048)


class KeyWebhook(BaseModel):
    url: str | None = Field(None, description="callback URL of the key's jobs without their own")
    has_secret: bool = False
    secret: str | None = Field(
        None,
        description="the signing secret: shown only in the answer that created it "
        "(POST /v1/webhook/secret, or the first PUT)",
    )
