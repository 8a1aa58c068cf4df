"""Export state files, `<job>/exports/<export id>.json`, shared by the API (creates, reads) and
the worker (runs, finishes). Same rules as job.json: atomic replace, read-modify-write under an
flock, so lock-free readers never see half a file.

An export's id is a digest of its format and options: asking twice for the same export answers
the one already made (or being made) instead of running it again. The worker running an export
holds an flock on `<id>.run` (`running()`); a `running` export whose lock is free lost its
worker (killed, restarted), and asking for it again starts it again."""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from api_schemas.exports import Export, ExportFormat, ExportStatus
from core.storage import JobPaths, LocalStorage, atomic_write_json
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


class ExportStore:
    def __init__(self, storage: LocalStorage):
        self.storage = storage

    def _paths(self, job_id: str) -> JobPaths:
        return self.storage.paths(job_id)

    def _file(self, job_id: str, eid: str):
        if not valid_export_id(eid):
            raise ExportNotFound(eid)
        return self._paths(job_id).exports / f"{eid}.json"

    @contextmanager
    def running(self, job_id: str, eid: str) -> Iterator[None]:
        """Held by the worker for the whole export; the kernel drops it however the worker dies."""
        path = self._file(job_id, eid).with_suffix(".run")
        with open(path, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _orphaned(self, job_id: str, export: Export) -> bool:
        if export.status != ExportStatus.running:
            return False
        try:
            with open(self._file(job_id, export.id).with_suffix(".run"), "a+") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
        except BlockingIOError:
            return False

    def get(self, job_id: str, eid: str) -> Export:
        try:
            return Export.model_validate_json(self._file(job_id, eid).read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            raise ExportNotFound(eid) from None

    def list(self, job_id: str) -> list[Export]:
        folder = self._paths(job_id).exports
        out = []
        for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                out.append(Export.model_validate_json(p.read_bytes()))
            except (OSError, ValueError):
                continue  # removed meanwhile
        return sorted(out, key=lambda e: (e.created_at, e.id))

    def create_or_get(
        self, job_id: str, fmt: ExportFormat, options: dict[str, Any]
    ) -> tuple[Export, bool]:
        """The export for these format and options, and whether it was (re)created just now: a
        failed one, or a running one whose worker is gone, is started again; anything else is
        answered as it stands."""
        eid = export_id(fmt, options)
        paths = self._paths(job_id)
        paths.exports.mkdir(parents=True, exist_ok=True)
        with open(paths.exports / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                try:
                    current = self.get(job_id, eid)
                except (ExportNotFound, ValueError):
                    current = None
                if (
                    current is not None
                    and current.status != ExportStatus.failed
                    and not self._orphaned(job_id, current)
                ):
                    return current, False
                now = utcnow()
                export = Export(
                    id=eid,
                    job_id=job_id,
                    format=fmt,
                    options=options,
                    created_at=now,
                    updated_at=now,
                )
                atomic_write_json(self._file(job_id, eid), export.model_dump(mode="json"))
                return export, True
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def update(self, job_id: str, eid: str, **fields: Any) -> Export:
        paths = self._paths(job_id)
        with open(paths.exports / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                export = self.get(job_id, eid).model_copy(update={**fields, "updated_at": utcnow()})
                # validate what was set (model_copy does not)
                export = Export.model_validate(export.model_dump())
                atomic_write_json(self._file(job_id, eid), export.model_dump(mode="json"))
                return export
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
