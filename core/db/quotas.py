"""Quota state per API key (service/quotas.py): a row per owner that admissions lock, the
submissions of the last hour, and the bytes each job stores."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from core.db.base import Base, UtcDateTime


class QuotaOwner(Base):
    """Locked (`FOR UPDATE`) for the whole of an admission or a charge: the check and what it
    admits are one transaction per key, however long the check takes."""

    __tablename__ = "quota_owners"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    admissions: Mapped[int] = mapped_column(Integer, default=0, nullable=False)


class Submission(Base):
    """One per admitted job, kept for an hour whether or not the job is deleted meanwhile."""

    __tablename__ = "quota_submissions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(64), nullable=False)
    job_id: Mapped[str] = mapped_column(String(36), nullable=False)
    at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)

    __table_args__ = (Index("ix_quota_submissions_owner_at", "owner", "at"),)


class JobStorage(Base):
    """Bytes a job stores (upload, dataset, checkpoints, artifacts, exports, renders), set where
    they are written; a key's use is the sum over its jobs' rows (joined on jobs.owner, so a
    deleted job's row counts no more)."""

    __tablename__ = "job_storage"

    job_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    stored_bytes: Mapped[int] = mapped_column(BigInteger, default=0, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), nullable=False)
