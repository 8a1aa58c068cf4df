"""Bytes each job stores (the job_storage table, core/db/quotas.py), which QUOTA_STORED_MB sums
per key. Set by the API once an upload is stored (service/quotas.py `charge`, under the key's
lock) and by the worker after it writes a job's files (a training's checkpoints and artifacts,
an export, a render job): measured from the storage's listing of that one job."""

from __future__ import annotations

import logging

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from core.db.engine import session
from core.db.quotas import JobStorage
from core.store import utcnow

log = logging.getLogger(__name__)


def measure(storage, job_id: str) -> int:
    """Bytes of the job's stored objects."""
    return sum(o.size for o in storage.list(job_id))


def put(s: Session, job_id: str, nbytes: int) -> None:
    """Set the job's stored bytes inside the caller's transaction."""
    ins = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    values = {"job_id": job_id, "stored_bytes": int(nbytes), "updated_at": utcnow()}
    s.execute(
        ins(JobStorage)
        .values(**values)
        .on_conflict_do_update(
            index_elements=[JobStorage.job_id],
            set_={"stored_bytes": values["stored_bytes"], "updated_at": values["updated_at"]},
        )
    )


def record(settings, job_id: str, nbytes: int) -> None:
    with session(settings) as s:
        put(s, job_id, nbytes)


def refresh(settings, storage, job_id: str) -> None:
    """Measure and record the job's stored bytes; a failure is logged, never raised (the work
    whose files were written has succeeded)."""
    try:
        record(settings, job_id, measure(storage, job_id))
    except Exception:
        log.warning("could not record the stored bytes of job %s", job_id, exc_info=True)
