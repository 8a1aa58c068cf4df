"""The renders table: render jobs (a camera path, or one large frame) rendered in the
background (core/path_jobs.py). The request is kept so a render whose message was lost can be
sent again."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from core.db.base import Base, Json, UtcDateTime


class RenderRow(Base):
    __tablename__ = "renders"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(36), nullable=False, index=True)
    kind: Mapped[str] = mapped_column(String(8), nullable=False)  # path | frame
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    format: Mapped[str] = mapped_column(String(16), nullable=False)
    n_frames: Mapped[int] = mapped_column(Integer, nullable=False)
    frames_done: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    n_pixels: Mapped[int | None] = mapped_column(BigInteger)
    pixels_done: Mapped[int | None] = mapped_column(BigInteger)
    checkpoint_step: Mapped[int | None] = mapped_column(Integer)
    artifact: Mapped[str | None] = mapped_column(String(255))
    error: Mapped[str | None] = mapped_column(Text)
    request: Mapped[dict[str, Any] | None] = mapped_column(Json)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)

    __table_args__ = (Index("ix_renders_status_updated_at", "status", "updated_at"),)
