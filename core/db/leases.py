"""Leases: who is working on what, until when, and how often its workers were lost.

One row per piece of work that one process at a time may do: a job's training (and its SfM
stage), an export, a render job, and the reaper itself. A worker claims the row (holder, expiry)
inside a transaction that locks it, renews the expiry while it works and clears the holder when
it ends. A counted delivery leaves `open` set until it ends; a claim that finds it still set
knows the previous worker died on it (`losses`). Work whose holder stopped renewing is what the
reaper sends again; `resent_at` keeps it from sending the same thing every round.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from core.db.base import Base, UtcDateTime

# Lease kinds (the `kind` column). SFM counts the SfM runs of a capture (its deliveries and the
# workers they lost); the run itself holds the job's TRAIN lease.
TRAIN, EXPORT, RENDER, REAPER, SFM = "train", "export", "render", "reaper", "sfm"


class Lease(Base):
    __tablename__ = "leases"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    # train, sfm: the job id; export: "<job id>/<export id>"; render: the render id.
    subject: Mapped[str] = mapped_column(String(80), primary_key=True)
    job_id: Mapped[str | None] = mapped_column(String(36), index=True)
    holder: Mapped[str | None] = mapped_column(String(255))
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    deliveries: Mapped[int] = mapped_column(Integer, default=0, nullable=False)
    losses: Mapped[int] = mapped_column(Integer, default=0, nullable=False)
    open: Mapped[bool] = mapped_column(Boolean, default=False, nullable=False)
    resent_at: Mapped[datetime | None] = mapped_column(UtcDateTime())

    # The reaper's scan of held leases that ran out: only leases with a holder are indexed
    # rows of interest, whatever the number of finished jobs.
    __table_args__ = (Index("ix_leases_kind_expires_at", "kind", "expires_at"),)
