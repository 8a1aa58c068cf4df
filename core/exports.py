"""Exports' state, rows of the `exports` table (core/db/exports.py), shared by the API (creates,
reads) and the worker (runs, finishes).

An export's id is a digest of its format and options: asking twice for the same export answers
the one already made (or being made) instead of running it again. The worker running an export
holds its lease (core/leases.py, kind `export`) and renews it; a `running` export whose lease is
free lost its worker (killed, its host gone), and asking for it again starts it again. Each
delivery is counted on the lease, so an export that kills its worker fails after
MAX_WORKER_LOSSES instead of taking one worker after another. While the worker holds
the lease (`running`), each update checks in its transaction that the lease is still that claim's
holder's (core.leases.fence), so a worker whose lease was taken over writes nothing more."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api_schemas.exports import Export, ExportFormat, ExportStatus
from core import leases
from core.db import migrate
from core.db.engine import database_url, db_now, session
from core.db.exports import ExportRow
from core.db.leases import EXPORT, Lease
from core.store import utcnow

EXPORT_ID_CHARS = 16


class ExportNotFound(KeyError):
    pass


def export_id(fmt: ExportFormat | str, options: dict[str, Any]) -> str:
    canonical = json.dumps(
        {"format": ExportFormat(fmt).value, "options": options}, sort_keys=True, default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:EXPORT_ID_CHARS]


def valid_export_id(value: str) -> bool:
    return len(value) == EXPORT_ID_CHARS and all(c in "0123456789abcdef" for c in value)


def lease_subject(job_id: str, eid: str) -> str:
    return f"{job_id}/{eid}"


def to_model(row: ExportRow) -> Export:
    return Export(
        id=row.id,
        job_id=row.job_id,
        format=row.format,
        options=row.options or {},
        status=row.status,
        created_at=row.created_at,
        updated_at=row.updated_at,
        artifact=row.artifact,
        url=row.url,
        size=row.size,
        stats=row.stats or {},
        error=row.error,
    )


class ExportStore:
    def __init__(self, storage=None, settings=None):
        """Rows in `settings`' database; by default the process's DATABASE_URL, else the SQLite
        file under the storage's DATA_DIR (as JobStore picks it)."""
        if settings is None:
            from core.settings import get_settings

            settings = get_settings()
            data_dir = getattr(storage, "data_dir", None)
            if not settings.database_url and data_dir is not None:
                settings = settings.model_copy(update={"data_dir": data_dir})
        migrate.ensure(database_url(settings))
        self.storage = storage
        self.settings = settings
        self._fence: leases.Claim | None = None  # set while `running` holds the lease

    def _row(self, s: Session, job_id: str, eid: str, lock: bool = False) -> ExportRow:
        if not valid_export_id(eid):
            raise ExportNotFound(eid)
        q = select(ExportRow).where(ExportRow.job_id == job_id, ExportRow.id == eid)
        row = s.execute(q.with_for_update() if lock else q).scalar_one_or_none()
        if row is None:
            raise ExportNotFound(eid)
        return row

    @contextmanager
    def running(self, job_id: str, eid: str, ttl_s: float | None = None) -> Iterator[Any]:
        """The export's lease, held and renewed while the worker runs it: yields its claim (the
        worker losses so far), or None when another live worker runs it. While held, this
        store's updates are fenced by the claim (LeaseLost once another holder has it)."""
        ttl = self.settings.lease_ttl_s if ttl_s is None else ttl_s
        subject = lease_subject(job_id, eid)
        with leases.held(self.settings, EXPORT, subject, ttl, job_id=job_id) as claim:
            previous = self._fence
            if claim is not None:
                self._fence = claim
            try:
                yield claim
            finally:
                self._fence = previous

    def _orphaned(self, s: Session, row: ExportRow) -> bool:
        if row.status != ExportStatus.running.value:
            return False
        lease = s.get(Lease, (EXPORT, lease_subject(row.job_id, row.id)))
        return leases.free(lease, db_now(s))

    def get(self, job_id: str, eid: str) -> Export:
        with session(self.settings) as s:
            return to_model(self._row(s, job_id, eid))

    def list(self, job_id: str) -> list[Export]:
        with session(self.settings) as s:
            rows = s.execute(
                select(ExportRow)
                .where(ExportRow.job_id == job_id)
                .order_by(ExportRow.created_at, ExportRow.id)
            ).scalars()
            return [to_model(r) for r in rows]

    def create_or_get(
        self, job_id: str, fmt: ExportFormat, options: dict[str, Any]
    ) -> tuple[Export, bool]:
        """The export for these format and options, and whether it was (re)created just now: a
        failed one, or a running one whose worker is gone, is started again (with its count of
        lost workers cleared for a failed one); anything else is answered as it stands."""
        eid = export_id(fmt, options)
        with session(self.settings, write=True) as s:
            try:
                current = self._row(s, job_id, eid, lock=True)
            except ExportNotFound:
                current = None
            if current is None:
                # Two requests creating it at once: the lease row's lock orders them.
                leases.locked(s, EXPORT, lease_subject(job_id, eid), job_id)
                current = s.execute(
                    select(ExportRow).where(ExportRow.job_id == job_id, ExportRow.id == eid)
                ).scalar_one_or_none()
            if current is not None:
                failed = current.status == ExportStatus.failed.value
                if not failed and not self._orphaned(s, current):
                    return to_model(current), False
                if failed:
                    lease = leases.locked(s, EXPORT, lease_subject(job_id, eid), job_id)
                    lease.deliveries, lease.losses, lease.open = 0, 0, False
                s.delete(current)
                s.flush()
            now = utcnow()
            row = ExportRow(
                job_id=job_id,
                id=eid,
                format=ExportFormat(fmt).value,
                options=options,
                status=ExportStatus.queued.value,
                stats={},
                created_at=now,
                updated_at=now,
            )
            s.add(row)
            s.flush()
            return to_model(row), True

    def update(self, job_id: str, eid: str, **fields: Any) -> Export:
        """Set `fields`; while `running` holds the lease, fenced by it and retried through
        transient database errors until it is lost."""
        if self._fence is None:
            return self._update(job_id, eid, fields)
        return leases.fenced(
            self._fence, lambda: self._update(job_id, eid, fields), f"writing export {eid}"
        )

    def _update(self, job_id: str, eid: str, fields: dict[str, Any]) -> Export:
        with session(self.settings, write=True) as s:
            row = self._row(s, job_id, eid, lock=True)
            leases.fence(s, self._fence)
            export = to_model(row).model_copy(update={**fields, "updated_at": utcnow()})
            # validate what was set (model_copy does not)
            export = Export.model_validate(export.model_dump())
            for name in ("status", "artifact", "url", "size", "stats", "error", "updated_at"):
                value = getattr(export, name)
                setattr(row, name, value.value if name == "status" else value)
            return export
