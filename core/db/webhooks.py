"""Webhook tables (core/webhooks.py): each key's callback URL and signing secret, a job's own
callback URL, and the delivery log (one row per event to deliver, numbered per job in event
order)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from core.db.base import Base, Json, UtcDateTime


class WebhookKey(Base):
    __tablename__ = "webhook_keys"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    url: Mapped[str | None] = mapped_column(Text)
    secret: Mapped[str | None] = mapped_column(String(128))


class WebhookJob(Base):
    __tablename__ = "webhook_jobs"

    job_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    url: Mapped[str] = mapped_column(Text, nullable=False)


class WebhookDeliveryRow(Base):
    __tablename__ = "webhook_deliveries"

    job_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(Text, nullable=False)
    event: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    attempts: Mapped[list[dict[str, Any]]] = mapped_column(Json, nullable=False, default=list)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)

    # The sender's poll: pending deliveries that are due, few whatever the log's length.
    __table_args__ = (Index("ix_webhook_deliveries_status_next", "status", "next_attempt_at"),)
