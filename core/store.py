"""JobStore: job.json read/modify/write plus the events.jsonl log, shared by API and worker.

The API (cancel) and the worker (progress, status) both write job.json, so every
read-modify-write holds an flock on the job's `.lock` file; the write itself is atomic so
lock-free readers never see half a file.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from api_schemas.jobs import Job, JobKind, JobStatus, Progress
from core.storage import JobPaths, LocalStorage, atomic_write_json

log = logging.getLogger(__name__)
# Called with the job after each status event is logged, outside the job's lock: webhook
# deliveries (core/webhooks.py) and metrics (core/metrics.py). One that raises is logged and
# never fails the status write.
StatusListener = Callable[[Job], None]


class JobNotFound(KeyError):
    pass


def utcnow() -> datetime:
    return datetime.now(UTC)


class JobStore:
    def __init__(self, storage: LocalStorage, listeners: Sequence[StatusListener] = ()):
        self.storage = storage
        self.listeners = list(listeners)

    def _notify(self, job: Job) -> None:
        for listener in self.listeners:
            try:
                listener(job)
            except Exception:
                log.exception("status listener failed for job %s", job.id)

    # -- locking -----------------------------------------------------------------------
    @contextmanager
    def _locked(self, paths: JobPaths) -> Iterator[None]:
        if not paths.root.is_dir():
            raise JobNotFound(paths.root.name)
        with open(paths.lock, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -- reads -------------------------------------------------------------------------
    def get(self, job_id: str) -> Job:
        paths = self.storage.paths(job_id)
        try:
            data = paths.job_json.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise JobNotFound(job_id) from None
        return Job.model_validate_json(data)

    def list(
        self,
        limit: int = 50,
        offset: int = 0,
        status: JobStatus | None = None,
        kind: JobKind | None = None,
    ) -> tuple[list[Job], int]:
        jobs = []
        for job_id in self.storage.job_ids():
            try:
                job = self.get(job_id)
            except (JobNotFound, ValueError):
                continue  # removed meanwhile, or being written for the first time
            if status is not None and job.status != status:
                continue
            if kind is not None and job.kind != kind:
                continue
            jobs.append(job)
        jobs.sort(key=lambda j: (j.created_at, j.id), reverse=True)
        return jobs[offset : offset + limit], len(jobs)

    # -- writes ------------------------------------------------------------------------
    def create(
        self, job_id: str, kind: str, config: dict[str, Any], dataset: dict[str, Any]
    ) -> Job:
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
        paths = self.storage.paths(job_id)
        with self._locked(paths):
            self._write(paths, job)
            self._append_event(paths, "status", self._status_data(job))
        self._notify(job)
        return job

    def update(
        self, job_id: str, fn: Callable[[Job], Job | None], status_event: bool = False
    ) -> Job:
        """Apply `fn` to the current job under the lock; `fn` returning None means no change.
        A status event is logged when the status changes, or on any change with status_event."""
        paths = self.storage.paths(job_id)
        with self._locked(paths):
            job = self.get(job_id)
            new = fn(job.model_copy(deep=True))
            if new is None:
                return job
            new.updated_at = utcnow()
            self._write(paths, new)
            logged = new.status != job.status or status_event
            if logged:
                self._append_event(paths, "status", self._status_data(new))
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
        paths = self.storage.paths(job_id)
        with self._locked(paths):
            job = self.get(job_id)
            job.progress = progress
            job.updated_at = utcnow()
            self._write(paths, job)
            self._append_event(paths, "progress", progress.model_dump(mode="json"))
            return job

    # -- events ------------------------------------------------------------------------
    def events(self, job_id: str, after: int = 0) -> list[dict[str, Any]]:
        """Events with id > after (what an SSE stream replays after Last-Event-ID)."""
        paths = self.storage.paths(job_id)
        out = []
        try:
            with open(paths.events, "rb") as fh:
                for line in fh:
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue  # a line being appended right now
                    if ev.get("id", 0) > after:
                        out.append(ev)
        except FileNotFoundError:
            pass
        return out

    # -- internals ---------------------------------------------------------------------
    @staticmethod
    def _status_data(job: Job) -> dict[str, Any]:
        return {
            "status": job.status.value,
            "error": job.error,
            "metrics": job.metrics,
            "updated_at": job.updated_at.isoformat(),
        }

    @staticmethod
    def _write(paths: JobPaths, job: Job) -> None:
        atomic_write_json(paths.job_json, job.model_dump(mode="json"))

    @staticmethod
    def _last_event_id(path: Path) -> int:
        try:
            with open(path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 4096))
                lines = fh.read().splitlines()
        except FileNotFoundError:
            return 0
        for line in reversed(lines):
            try:
                return int(json.loads(line)["id"])
            except (ValueError, KeyError, TypeError):
                continue
        return 0

    def _append_event(self, paths: JobPaths, event: str, data: dict[str, Any]) -> None:
        # Caller holds the lock, so ids stay strictly increasing.
        ev = {"id": self._last_event_id(paths.events) + 1, "event": event, "data": data}
        with open(paths.events, "ab") as fh:
            end = fh.tell()
            try:
                fh.write((json.dumps(ev, default=str) + "\n").encode())
                fh.flush()
            except OSError:
                # A torn line (full disk) would also swallow the next event appended after it.
                fh.truncate(end)
                raise
