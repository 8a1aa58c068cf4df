"""Deleting a job removes every row that names it (job, events, exports, render jobs, leases,
stored bytes) and nothing of another job; the hour's quota submissions stay."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import func, select

from api_schemas.jobs import JobStatus
from core.db.engine import engine_for_url, session
from core.db.exports import ExportRow
from core.db.jobs import JobEventRow, JobRow
from core.db.leases import Lease
from core.db.quotas import JobStorage, Submission
from core.db.renders import RenderRow
from core.storage import LocalStorage
from core.store import JobStore

PER_JOB = (JobRow, JobEventRow, ExportRow, RenderRow, Lease, JobStorage, Submission)


def _rows(store: JobStore, job_id: str) -> dict[str, int]:
    out = {}
    with session(engine=engine_for_url(store.url)) as s:
        for table in PER_JOB:
            column = table.id if table is JobRow else table.job_id
            out[table.__tablename__] = s.scalar(select(func.count()).where(column == job_id))
    return out


def _job_with_rows(store: JobStore) -> str:
    job_id = str(uuid.uuid4())
    store.create(job_id, "image", {}, {}, owner="h-owner")
    store.set_status(job_id, JobStatus.running)
    now = datetime.now(UTC)
    with session(engine=engine_for_url(store.url)) as s:
        s.add(
            ExportRow(
                job_id=job_id,
                id="e1",
                format="ply",
                status="succeeded",
                created_at=now,
                updated_at=now,
            )
        )
        s.add(
            RenderRow(
                id=str(uuid.uuid4()),
                job_id=job_id,
                kind="path",
                status="succeeded",
                format="webp",
                n_frames=3,
                created_at=now,
                updated_at=now,
            )
        )
        s.add(Lease(kind="train", subject=job_id, job_id=job_id))
        s.add(JobStorage(job_id=job_id, stored_bytes=10, updated_at=now))
        s.add(Submission(owner="h-owner", job_id=job_id, at=now))
    return job_id


def test_delete_removes_every_row_of_the_job_only(tmp_path):
    store = JobStore(LocalStorage(tmp_path))
    gone, kept = _job_with_rows(store), _job_with_rows(store)
    before = _rows(store, gone)
    assert all(before.values()), before
    store.delete(gone)
    after = _rows(store, gone)
    assert after == {**{t: 0 for t in after}, "quota_submissions": 1}, after
    assert all(_rows(store, kept).values()), _rows(store, kept)
