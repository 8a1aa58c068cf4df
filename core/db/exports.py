"""The exports table: one row per (job, export id); the id is a digest of the format and
options (core/exports.py), so asking twice for the same export finds the same row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from core.db.base import Base, Json, UtcDateTime


class ExportRow(Base):
    __tablename__ = "exports"

    job_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    format: Mapped[str] = mapped_column(String(32), nullable=False)
    options: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False, default=dict)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    artifact: Mapped[str | None] = mapped_column(String(255))
    url: Mapped[str | None] = mapped_column(Text)
    size: Mapped[int | None] = mapped_column(BigInteger)
    stats: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False, default=dict)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)

    # The reaper's look at unfinished exports (queued, running), few whatever the finished ones.
    __table_args__ = (Index("ix_exports_status_updated_at", "status", "updated_at"),)
