"""Per-key quotas, as queries on the job database.

Checked when a job is submitted, before its upload is read: queued + running + still-uploading
jobs (QUOTA_ACTIVE_JOBS), submissions in the last hour (QUOTA_JOBS_PER_HOUR, kept for the hour
even when a job is deleted), bytes the key's jobs store (QUOTA_STORED_MB; the room left also
caps the upload that follows). Once the upload is stored, `charge` records its size, and refuses
it when the key's other jobs have used the room meanwhile: parallel uploads are admitted up to
the room left, not each up to all of it.

Each admission and each charge is one transaction holding the key's `quota_owners` row
(`SELECT ... FOR UPDATE`; SQLite's write lock): parallel submissions from any number of API
replicas are checked one after the other, and the lock lasts as long as the check, however
long that is (a lock with an expiry can lapse mid-check).
"""

from __future__ import annotations

import logging
import math
import uuid
from datetime import timedelta
from typing import NamedTuple

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from api_schemas.jobs import JobStatus
from core import usage
from core.db.engine import db_now, insert_if_missing, session
from core.db.jobs import RESERVED, JobRow
from core.db.quotas import JobStorage, QuotaOwner, Submission
from core.storage import JobPaths, Storage
from core.store import JobStore
from service.auth import ApiKey

log = logging.getLogger(__name__)
HOUR = 3600.0
ACTIVE = (JobStatus.queued.value, JobStatus.running.value, RESERVED)


class Admission(NamedTuple):
    job_id: str
    paths: JobPaths
    room_bytes: int  # storage left under the key's QUOTA_STORED_MB


class QuotaExceeded(Exception):
    def __init__(self, status_code: int, detail: str, retry_after: float | None = None):
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str] | None:
        if self.retry_after is None:
            return None
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


def lock_owner(s: Session, kid: str) -> QuotaOwner:
    """The key's row, created if missing, locked to the end of the transaction."""
    insert_if_missing(s, QuotaOwner, owner=kid, admissions=0)
    return s.execute(
        select(QuotaOwner).where(QuotaOwner.owner == kid).with_for_update()
    ).scalar_one()


def stored_bytes(s: Session, kid: str, *, besides: str | None = None) -> int:
    """Bytes stored by the key's jobs (but `besides`)."""
    q = (
        select(func.coalesce(func.sum(JobStorage.stored_bytes), 0))
        .select_from(JobStorage)
        .join(JobRow, JobRow.id == JobStorage.job_id)
        .where(JobRow.owner == kid)
    )
    if besides is not None:
        q = q.where(JobStorage.job_id != besides)
    return int(s.scalar(q) or 0)


def active_jobs(s: Session, kid: str) -> int:
    q = (
        select(func.count())
        .select_from(JobRow)
        .where(JobRow.owner == kid, JobRow.status.in_(ACTIVE))
    )
    return int(s.scalar(q) or 0)


class Quotas:
    def __init__(self, storage: Storage, store: JobStore, settings):
        self.storage = storage
        self.store = store
        self.settings = settings

    def _session(self, write: bool = False):
        return session(engine=self.store.engine, write=write)

    @property
    def cap(self) -> int:
        return int(self.settings.quota_stored_mb * 1024 * 1024)

    # -- reads ---------------------------------------------------------------------------------
    def stored_bytes(self, kid: str) -> int:
        with self._session() as s:
            return stored_bytes(s, kid)

    # -- admission -----------------------------------------------------------------------------
    def admit(self, key: ApiKey) -> Admission:
        """Check the key's quotas and reserve the job (its row, owner recorded, and its folder),
        or raise QuotaExceeded naming the setting (503 when the database cannot be reached)."""
        try:
            return self._admit(key)
        except OperationalError as exc:
            # The exception names the database's host: logged, never sent to the client.
            log.warning("quota check failed: %s", exc)
            raise QuotaExceeded(
                503, f"the job database is unavailable ({type(exc).__name__})"
            ) from None

    def _admit(self, key: ApiKey) -> Admission:
        s_ = self.settings
        with self._session(write=True) as s:
            lock_owner(s, key.id)
            # The database's clock: the reservation's age is judged with it (worker/reaper.py),
            # and the hour's submissions of every replica compare in one clock.
            now = db_now(s)
            active = active_jobs(s, key.id)
            if active >= s_.quota_active_jobs:
                raise QuotaExceeded(
                    429,
                    f"this API key has {active} queued or running jobs, the limit is "
                    f"{s_.quota_active_jobs} (QUOTA_ACTIVE_JOBS); wait for one to finish",
                    retry_after=30,
                )
            hour_ago = now - timedelta(seconds=HOUR)
            s.execute(
                delete(Submission).where(Submission.owner == key.id, Submission.at <= hour_ago)
            )
            n, first = s.execute(
                select(func.count(), func.min(Submission.at)).where(Submission.owner == key.id)
            ).one()
            if n >= s_.quota_jobs_per_hour:
                raise QuotaExceeded(
                    429,
                    f"this API key submitted {n} jobs in the last hour, the limit is "
                    f"{s_.quota_jobs_per_hour} (QUOTA_JOBS_PER_HOUR)",
                    retry_after=(first - hour_ago).total_seconds(),
                )
            used = stored_bytes(s, key.id)
            if used >= self.cap:
                raise QuotaExceeded(
                    413,
                    f"this API key's jobs store {used} bytes, the limit is {self.cap} "
                    f"(QUOTA_STORED_MB); delete finished jobs first",
                )
            job_id = str(uuid.uuid4())
            # The row as JobStore.reserve makes it, in this transaction: never visible
            # ownerless, and counted by the next admission of this key.
            s.add(
                JobRow(
                    id=job_id,
                    kind=None,
                    status=RESERVED,
                    owner=key.id,
                    created_at=now,
                    updated_at=now,
                    config={},
                    dataset={},
                    metrics={},
                    progress={},
                    cancel_requested=False,
                    last_seq=0,
                )
            )
            s.add(Submission(owner=key.id, job_id=job_id, at=now))
            usage.put(s, job_id, 0)
        # Made once the row is in: a folder never lacks its row (the reaper removes reserved
        # rows whose upload was abandoned, with their files).
        self.storage.ensure()
        paths = self.storage.paths(job_id)
        paths.root.mkdir()
        return Admission(job_id, paths, self.cap - used)

    def charge(self, key: ApiKey, job_id: str, nbytes: int | None = None) -> int:
        """Record what the admitted job stores once its upload is in (measured when `nbytes` is
        None); QuotaExceeded (413) when that and the key's other jobs pass QUOTA_STORED_MB (the
        caller then discards the job). Returns the bytes recorded."""
        if nbytes is None:
            nbytes = usage.measure(self.storage, job_id)
        with self._session(write=True) as s:
            lock_owner(s, key.id)
            others = stored_bytes(s, key.id, besides=job_id)
            if others + nbytes > self.cap:
                raise QuotaExceeded(
                    413,
                    f"this upload ({nbytes} bytes) and this API key's other jobs ({others} "
                    f"bytes) pass the limit of {self.cap} bytes (QUOTA_STORED_MB)",
                )
            usage.put(s, job_id, nbytes)
        return nbytes

    def rename_keys(self, renames: dict[str, str]) -> int:
        """Move quota state of key id `old` to `new` (submissions; the owner rows follow)."""
        moved = 0
        with self._session(write=True) as s:
            for old, new in renames.items():
                if old == new:
                    continue
                moved += s.execute(
                    update(Submission).where(Submission.owner == old).values(owner=new)
                ).rowcount
                s.execute(delete(QuotaOwner).where(QuotaOwner.owner == old))
        return moved
