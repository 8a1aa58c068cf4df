"""JobStore: job state and the per-job event log in the database (core/db/jobs.py), shared by the
API and the workers.

Every change is one transaction that locks the job's row first (`SELECT ... FOR UPDATE` on
PostgreSQL, SQLite's write lock from BEGIN IMMEDIATE), so an API replica cancelling and a worker
writing progress never lose each other's update. An event is inserted in the same transaction
as the change it reports, numbered from the row's `last_seq`: seqs per job grow strictly, which
is what an SSE stream's Last-Event-ID resumes from. On PostgreSQL the transaction also sends
NOTIFY on core.db.notify's CHANNEL with the job id, delivered at commit, to wake event streams
(core/db/notify.py).

A store `fenced(claim)` (a worker's, holding the job's train lease) checks in every write's
transaction that the lease still names that claim's holder (core.leases.fence): a worker whose
lease another one took can no longer change the job (LeaseLost).

A reserved row (an admitted upload) is kept fresh by its upload (`keep_reserved`), made a job
only while it is still there (`create(..., reserved=True)`, ReservationGone otherwise), and
removed by the reaper only while still reserved and stale, re-checked under its row's lock
(`drop_reservations`). Times that expire (reservations) are the database's clock.

The job's files (uploads, dataset, checkpoints, artifacts) stay in storage; only state is here.
"""

from __future__ import annotations

import base64
import copy
import errno
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, text, tuple_, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from api_schemas.jobs import Job, JobKind, JobStatus, Progress
from core import leases
from core.db import migrate
from core.db.engine import database_url, db_now, engine_for_url, session
from core.db.exports import ExportRow
from core.db.jobs import RESERVED, JobEventRow, JobRow
from core.db.leases import Lease
from core.db.notify import CHANNEL
from core.db.quotas import JobStorage
from core.db.renders import RenderRow
from core.storage import parse_job_id

log = logging.getLogger(__name__)
# Called with the job after each status event is logged, once its transaction has committed:
# metrics (core/metrics.py). One that raises is logged and never fails the status write. A
# listener with an `in_transaction(session, job)` method is also called inside the status
# change's transaction, the job's row locked (webhook deliveries, core/webhooks.py: an outbox);
# one that raises there fails the change, so both are written or neither.
StatusListener = Callable[[Job], None]


class JobNotFound(KeyError):
    pass


class ReservationGone(JobNotFound):
    """An upload's reserved row is gone (the reaper removed it as abandoned, or it was
    cancelled): its upload cannot become a job."""


class BadCursor(ValueError):
    """A listing cursor this server did not make."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def _to_job(row: JobRow) -> Job:
    return Job(
        id=row.id,
        kind=row.kind,
        status=row.status,
        created_at=row.created_at,
        updated_at=row.updated_at,
        config=row.config or {},
        progress=Progress.model_validate(row.progress or {}),
        metrics=row.metrics or {},
        error=row.error,
        dataset=row.dataset or {},
    )


def encode_cursor(job: Job) -> str:
    """The opaque listing cursor after `job`: its (created_at, id), base64url JSON."""
    raw = json.dumps([job.created_at.isoformat(), job.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stamp, job_id = json.loads(raw)
        at = datetime.fromisoformat(stamp)
        if at.tzinfo is None:
            raise ValueError
        return at.astimezone(UTC), parse_job_id(job_id)
    except (ValueError, TypeError, OverflowError):
        raise BadCursor(f"not a cursor of this listing: {cursor[:40]!r}") from None


class CancelFlag:
    """`store.cancel_requested(job_id)` as a callable for loops that poll it every step: the
    database is asked at most every `every_s` seconds, and a raised flag stays raised."""

    def __init__(self, store: JobStore, job_id: str, every_s: float = 0.5):
        self.store, self.job_id, self.every_s = store, job_id, every_s
        self._raised = False
        self._next = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self._raised and now >= self._next:
            self._raised = self.store.cancel_requested(self.job_id)
            self._next = now + self.every_s
        return self._raised


class JobStore:
    def __init__(
        self,
        storage,
        listeners: Sequence[StatusListener] = (),
        settings=None,
        url: str | None = None,
    ):
        """`url`, else `settings`' database (DATABASE_URL), else the SQLite file under the
        storage's DATA_DIR. Migrations are applied once per process and database."""
        self.storage = storage
        self.listeners = list(listeners)
        if url is None and settings is None:
            from core.settings import get_settings

            url = get_settings().database_url or f"sqlite:///{storage.data_dir / 'service.db'}"
        if url is None:
            url = database_url(settings)
        self.url = url
        migrate.ensure(url)
        self.engine = engine_for_url(url)
        self._pg = self.engine.dialect.name == "postgresql"
        self._read_engine = (
            self.engine.execution_options(isolation_level="AUTOCOMMIT") if self._pg else self.engine
        )
        self._fence: leases.Claim | None = None

    def fenced(self, claim: leases.Claim) -> JobStore:
        """This store, with every job write checking in its transaction that the job's lease
        (`claim`: a train lease) is still `claim`'s holder's; a write refused raises LeaseLost
        and sets `claim.lost`."""
        other = copy.copy(self)
        other._fence = claim
        return other

    def confirm(self, job_id: str) -> None:
        """LeaseLost unless the fence's lease is still this holder's (a write outside the
        database, such as a checkpoint's pointer, is made only after this)."""

        def check() -> None:
            with self._session(write=True) as s:
                self._lock_row(s, job_id)

        self._retried(check, f"confirming the lease of job {job_id}")

    def _retried(self, fn: Callable[[], Any], what: str) -> Any:
        """A fenced store's write: transient database errors retried with backoff for as long
        as the lease is held (`leases.fenced`); an unfenced one is tried once."""
        if self._fence is None:
            return fn()
        return leases.fenced(self._fence, fn, what)

    def _notify(self, job: Job) -> None:
        for listener in self.listeners:
            try:
                listener(job)
            except Exception:
                log.exception("status listener failed for job %s", job.id)

    @contextmanager
    def _session(self, write: bool = False) -> Iterator[Session]:
        """A transaction; `write=False` only reads (on PostgreSQL in autocommit: no BEGIN and
        COMMIT round trips. Reads that must agree, like `poll`'s, read the job row first)."""
        engine = self.engine if write else self._read_engine
        try:
            with session(engine=engine, write=write) as s:
                yield s
        except OperationalError as exc:
            # SQLite on a full or failing disk: an OSError like any other file write, which
            # callers already handle (worker/tasks.py retries recording a failure until space is
            # back).
            if "disk is full" in str(exc.orig):
                raise OSError(errno.ENOSPC, f"No space left on device ({exc.orig})") from exc
            if "disk I/O error" in str(exc.orig):
                raise OSError(errno.EIO, f"Input/output error ({exc.orig})") from exc
            raise

    # -- reads -------------------------------------------------------------------------
    def get(self, job_id: str) -> Job:
        with self._session() as s:
            row = s.get(JobRow, job_id)
            if row is None or row.status == RESERVED:
                raise JobNotFound(job_id)
            return _to_job(row)

    def exists(self, job_id: str) -> bool:
        """Whether the job has been made (a reserved upload is not yet)."""
        with self._session() as s:
            status = s.scalar(select(JobRow.status).where(JobRow.id == job_id))
        return status is not None and status != RESERVED

    def list(
        self,
        limit: int = 50,
        offset: int = 0,
        status: JobStatus | None = None,
        kind: JobKind | None = None,
        owner: str | None = None,
        cursor: str | None = None,
    ) -> tuple[list[Job], int]:
        """Jobs newest first (of `owner` when given) and how many match in all. `cursor` (from
        `encode_cursor` of the last job of a page) continues after that job through the
        (owner, created_at, id) index: jobs made meanwhile never shift the pages."""
        conds = [JobRow.status != RESERVED]
        if owner is not None:
            conds.append(JobRow.owner == owner)
        if status is not None:
            conds.append(JobRow.status == JobStatus(status).value)
        if kind is not None:
            conds.append(JobRow.kind == JobKind(kind).value)
        with self._session() as s:
            total = s.scalar(select(func.count()).select_from(JobRow).where(*conds)) or 0
            q = select(JobRow).where(*conds)
            if cursor is not None:
                at, last_id = decode_cursor(cursor)
                q = q.where(tuple_(JobRow.created_at, JobRow.id) < tuple_(at, last_id))
            q = q.order_by(JobRow.created_at.desc(), JobRow.id.desc())
            if cursor is None and offset:
                q = q.offset(offset)
            rows = s.scalars(q.limit(limit)).all()
            return [_to_job(r) for r in rows], total

    def counts(self) -> dict[tuple[str, str], int]:
        """How many jobs there are per (kind, status), reserved uploads left out."""
        with self._session() as s:
            rows = s.execute(
                select(JobRow.kind, JobRow.status, func.count())
                .where(JobRow.status != RESERVED)
                .group_by(JobRow.kind, JobRow.status)
            ).all()
        return {(kind, status): n for kind, status, n in rows}

    def owner_of(self, job_id: str) -> str | None:
        """The key id that owns the job (also while its upload is being admitted)."""
        with self._session() as s:
            return s.scalar(select(JobRow.owner).where(JobRow.id == job_id))

    def cancel_requested(self, job_id: str) -> bool:
        with self._session() as s:
            return bool(s.scalar(select(JobRow.cancel_requested).where(JobRow.id == job_id)))

    def active_count(self, owner: str) -> int:
        """The owner's queued, running and still-uploading (reserved) jobs."""
        live = (JobStatus.queued.value, JobStatus.running.value, RESERVED)
        with self._session() as s:
            return (
                s.scalar(
                    select(func.count())
                    .select_from(JobRow)
                    .where(JobRow.owner == owner, JobRow.status.in_(live))
                )
                or 0
            )

    # -- writes ------------------------------------------------------------------------
    def reserve(self, job_id: str, owner: str | None) -> None:
        """A row for a job whose upload is being read: its owner is recorded before anything
        else, and it stays invisible to get/list until `create`."""
        with self._session(write=True) as s:
            now = db_now(s)
            s.add(
                JobRow(
                    id=job_id,
                    kind=None,
                    status=RESERVED,
                    owner=owner,
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

    def create(
        self,
        job_id: str,
        kind: str,
        config: dict[str, Any],
        dataset: dict[str, Any],
        owner: str | None = None,
        *,
        reserved: bool = False,
    ) -> Job:
        """Make the job queued. `reserved`: from its upload's reserved row (owner and all),
        which must still be there: ReservationGone otherwise (never a job without its owner)."""
        now = utcnow()
        job = Job(
            id=job_id,
            kind=kind,
            status=JobStatus.queued,
            created_at=now,
            updated_at=now,
            config=config,
            dataset=dataset,
        )
        with self._session(write=True) as s:
            row = self._lock_row(s, job_id, reserved_ok=True)
            if row is None and reserved:
                raise ReservationGone(job_id)
            if row is None:
                row = JobRow(id=job_id, owner=owner, cancel_requested=False, last_seq=0)
                s.add(row)
            elif row.status != RESERVED:
                raise ValueError(f"job {job_id} exists already")
            if owner is not None:
                row.owner = owner
            self._fill(row, job)
            row.created_at = now
            s.flush()
            self._status_logged(s, row, job)
        self._notify(job)
        return job

    def update(
        self, job_id: str, fn: Callable[[Job], Job | None], status_event: bool = False
    ) -> Job:
        """Apply `fn` to the current job inside one transaction holding the row's lock; `fn`
        returning None means no change. A status event is logged when the status changes, or on
        any change with status_event."""
        return self._retried(
            lambda: self._update(job_id, fn, status_event), f"writing job {job_id}"
        )

    def _update(self, job_id: str, fn: Callable[[Job], Job | None], status_event: bool) -> Job:
        with self._session(write=True) as s:
            row = self._lock_row(s, job_id)
            job = _to_job(row)
            new = fn(job.model_copy(deep=True))
            if new is None:
                return job
            new.updated_at = utcnow()
            self._fill(row, new)
            logged = new.status != job.status or status_event
            if logged:
                self._status_logged(s, row, new)
        if logged:
            self._notify(new)
        return new

    def set_status(
        self,
        job_id: str,
        status: JobStatus,
        *,
        error: str | None = None,
        metrics: dict[str, Any] | None = None,
        only_from: set[JobStatus] | None = None,
    ) -> Job:
        def change(job: Job) -> Job | None:
            if only_from is not None and job.status not in only_from:
                return None
            job.status = status
            if error is not None:
                job.error = error
            if metrics is not None:
                job.metrics = metrics
            return job

        return self.update(job_id, change)

    def set_progress(self, job_id: str, progress: Progress) -> Job:
        data = progress.model_dump(mode="json")

        def write() -> Job:
            with self._session(write=True) as s:
                row = self._lock_row(s, job_id)
                row.progress = data
                row.updated_at = utcnow()
                self._append_event(s, row, "progress", data)
                return _to_job(row)

        return self._retried(write, f"writing job {job_id}'s progress")

    def request_cancel(self, job_id: str) -> Job:
        """Raise the job's cancel flag (a running trainer polls it, a worker picking the task up
        checks it) and cancel a still-queued job on the spot, in one transaction."""
        with self._session(write=True) as s:
            row = self._lock_row(s, job_id)
            row.cancel_requested = True
            job = _to_job(row)
            if job.status != JobStatus.queued:
                return job
            job.status = JobStatus.cancelled
            job.updated_at = utcnow()
            self._fill(row, job)
            self._status_logged(s, row, job)
        self._notify(job)
        return job

    # -- reservations ------------------------------------------------------------------
    def touch_reservation(self, job_id: str) -> bool:
        """Mark the upload's reserved row as alive now (the database's clock); False when it is
        no longer a reservation (removed, or made a job)."""
        with self._session(write=True) as s:
            n = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == RESERVED)
                .values(updated_at=db_now(s))
            ).rowcount
        return n == 1

    @contextmanager
    def keep_reserved(
        self, job_id: str, stale_s: float, touch_first: bool = True
    ) -> Iterator[None]:
        """Keep the upload's reserved row fresh while the block runs (touched at once unless
        `touch_first` is False, then every `stale_s` / 4, at most every minute, from a thread),
        so the reaper never counts a live upload stale. ReservationGone at once when the row is
        already gone."""
        if touch_first and not self.touch_reservation(job_id):
            raise ReservationGone(job_id)
        every = min(60.0, max(stale_s / 4, 0.05))
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(every):
                try:
                    if not self.touch_reservation(job_id):
                        return  # made a job, or removed: nothing more to keep
                except Exception:
                    log.warning(
                        "could not keep upload %s's reservation fresh", job_id, exc_info=True
                    )

        thread = threading.Thread(target=beat, name=f"reserved-{job_id[:8]}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=1)

    def stale_reservations(self, stale_s: float) -> list[str]:
        """Reserved rows untouched for `stale_s` by the database's clock (candidates only:
        `drop_reservations` re-checks each under its lock)."""
        with self._session() as s:
            cutoff = db_now(s) - timedelta(seconds=stale_s)
            return list(
                s.scalars(
                    select(JobRow.id).where(JobRow.status == RESERVED, JobRow.updated_at < cutoff)
                )
            )

    def drop_reservations(self, ids: Sequence[str], stale_s: float) -> list[str]:
        """Delete the rows of `ids` that are still reserved and stale, judged in one transaction
        holding their locks (FOR UPDATE SKIP LOCKED: a row an upload is touching or making a job
        right now is left alone; SQLite's write lock from BEGIN). Returns the ids deleted; their
        files are the caller's to remove, after this."""
        if not ids:
            return []
        with self._session(write=True) as s:
            cutoff = db_now(s) - timedelta(seconds=stale_s)
            gone = list(
                s.scalars(
                    select(JobRow.id)
                    .where(
                        JobRow.id.in_(list(ids)),
                        JobRow.status == RESERVED,
                        JobRow.updated_at < cutoff,
                    )
                    .with_for_update(skip_locked=True)
                )
            )
            for job_id in gone:
                self._delete_rows(s, job_id)
        return gone

    def rename_owner(self, old: str, new: str) -> int:
        """Move every job of key id `old` to `new`; returns how many moved."""
        with self._session(write=True) as s:
            return s.execute(update(JobRow).where(JobRow.owner == old).values(owner=new)).rowcount

    def delete(self, job_id: str) -> None:
        """Remove the job's row, its events and the rows of its exports, render jobs, leases
        and stored bytes (its files are the storage's). Its quota submissions stay: they count
        for the hour whether or not the job is deleted."""
        with self._session(write=True) as s:
            # The job's row first: writers lock it before its lease (fenced writes), so taking
            # them in that order too never deadlocks with one.
            s.execute(select(JobRow.id).where(JobRow.id == job_id).with_for_update())
            self._delete_rows(s, job_id)

    @staticmethod
    def _delete_rows(s: Session, job_id: str) -> None:
        for table in (JobEventRow, ExportRow, RenderRow, Lease, JobStorage):
            s.execute(delete(table).where(table.job_id == job_id))
        s.execute(delete(JobRow).where(JobRow.id == job_id))

    # -- events ------------------------------------------------------------------------
    def events(self, job_id: str, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """Events with id > after, oldest first (what an SSE stream replays after
        Last-Event-ID), each {"id", "event", "data"}."""
        with self._session() as s:
            return self._events(s, job_id, after, limit)

    def poll(
        self, job_id: str, after: int = 0, limit: int | None = None
    ) -> tuple[list[dict[str, Any]], Job | None]:
        """The job, then its events after `after`, read in that order (so a terminal job's
        status event is always among the events or before `after`); job None once deleted."""
        with self._session() as s:
            row = s.get(JobRow, job_id)
            if row is None or row.status == RESERVED:
                return [], None
            return self._events(s, job_id, after, limit), _to_job(row)

    @staticmethod
    def _events(s: Session, job_id: str, after: int, limit: int | None) -> list[dict[str, Any]]:
        q = (
            select(JobEventRow.seq, JobEventRow.event, JobEventRow.data)
            .where(JobEventRow.job_id == job_id, JobEventRow.seq > after)
            .order_by(JobEventRow.seq)
        )
        if limit is not None:
            q = q.limit(limit)
        return [{"id": seq, "event": ev, "data": data} for seq, ev, data in s.execute(q)]

    # -- internals ---------------------------------------------------------------------
    @staticmethod
    def _status_data(job: Job) -> dict[str, Any]:
        return {
            "status": job.status.value,
            "error": job.error,
            "metrics": job.metrics,
            "updated_at": job.updated_at.isoformat(),
        }

    def _lock_row(self, s: Session, job_id: str, reserved_ok: bool = False) -> JobRow | None:
        """The job's row, locked for the transaction; with a fence, only while the lease is
        still the fence's holder's (LeaseLost otherwise: nothing is written)."""
        row = s.scalars(select(JobRow).where(JobRow.id == job_id).with_for_update()).one_or_none()
        if row is not None:
            leases.fence(s, self._fence)
        if reserved_ok:
            return row
        if row is None or row.status == RESERVED:
            raise JobNotFound(job_id)
        return row

    @staticmethod
    def _fill(row: JobRow, job: Job) -> None:
        data = job.model_dump(mode="json")
        row.kind = data["kind"]
        row.status = data["status"]
        row.updated_at = job.updated_at
        row.config = data["config"]
        row.dataset = data["dataset"]
        row.metrics = data["metrics"]
        row.progress = data["progress"]
        row.error = job.error

    def _status_logged(self, s: Session, row: JobRow, job: Job) -> None:
        """The status event, and what transactional listeners record with it (webhooks)."""
        self._append_event(s, row, "status", self._status_data(job))
        for listener in self.listeners:
            in_tx = getattr(listener, "in_transaction", None)
            if in_tx is not None:
                in_tx(s, job)

    def _append_event(self, s: Session, row: JobRow, event: str, data: dict[str, Any]) -> None:
        # The row is locked by this transaction, so the seq cannot be taken twice.
        row.last_seq = (row.last_seq or 0) + 1
        s.add(
            JobEventRow(
                job_id=row.id,
                seq=row.last_seq,
                event=event,
                data=json.loads(json.dumps(data, default=str)),
                created_at=utcnow(),
            )
        )
        if self._pg:
            s.execute(text("SELECT pg_notify(:ch, :id)"), {"ch": CHANNEL, "id": row.id})
