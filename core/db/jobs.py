"""The jobs table (one row per job: its state, owner and cancel flag) and job_events (the
per-job event log an SSE stream replays after Last-Event-ID)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from core.db.base import Base, Json, UtcDateTime

# A row inserted when an upload is admitted (its owner is known, its job not yet made); the
# store hides such rows until `create` fills them in.
RESERVED = "reserved"


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    kind: Mapped[str | None] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    owner: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime())
    config: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    dataset: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    metrics: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    progress: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # The seq of the job's newest event; bumped under the row's lock, so seqs never repeat.
    last_seq: Mapped[int] = mapped_column(Integer, default=0)

    __table_args__ = (
        # GET /v1/jobs: the owner's jobs newest first, keyset-paginated on (created_at, id).
        Index("ix_jobs_owner_created", "owner", "created_at", "id"),
        # The listing's `total` (an index-only count of the owner's jobs) and its status filter.
        Index("ix_jobs_owner_status_created", "owner", "status", "created_at", "id"),
        Index("ix_jobs_status", "status"),
    )


class JobEventRow(Base):
    __tablename__ = "job_events"

    job_id: Mapped[str] = mapped_column(
        String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    event: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime())
