"""Per-key quotas and the per-key job index.

Checked when a job is submitted, before its upload is read: queued + running jobs
(QUOTA_ACTIVE_JOBS), submissions in the last hour (QUOTA_JOBS_PER_HOUR), disk used by the key's
job folders (QUOTA_STORED_MB; the room left also caps the upload that follows, so one upload
cannot carry a key far past it). The check and the reservation of the new job folder happen under
one per-key lock, so parallel submissions (from any number of API replicas) cannot both take
the last slot: the lock and the hourly window live in Redis when REDIS_URL is set, else in an
flock'ed file under DATA_DIR.

The index (`DATA_DIR/keys/<key id>/jobs/<created ns>-<job id>`, empty files) lists each key's
jobs, so `GET /v1/jobs` and the quota check read that key's jobs only, never every job.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from api_schemas.jobs import Job, JobStatus
from core.storage import JobPaths, LocalStorage, atomic_write_json
from core.store import JobNotFound, JobStore
from service.auth import ApiKey, record_owner

log = logging.getLogger(__name__)
HOUR = 3600.0
# Where versions before the jobs table recorded a job's owner; read only to index such jobs.
OWNER_FILE = "owner"


class Admission(NamedTuple):
    job_id: str
    paths: JobPaths
    room_bytes: int  # disk left under the key's QUOTA_STORED_MB


ACTIVE = {JobStatus.queued, JobStatus.running}


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


def _dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


class KeyIndex:
    def __init__(self, storage: LocalStorage):
        self.storage = storage
        self.root = storage.data_dir / "keys"

    def folder(self, kid: str) -> Path:
        return self.root / kid / "jobs"

    def add(self, kid: str, job_id: str) -> None:
        folder = self.folder(kid)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{time.time_ns():020d}-{job_id}").touch()

    def remove(self, kid: str, job_id: str) -> None:
        folder = self.folder(kid)
        if folder.is_dir():
            for p in folder.glob(f"*-{job_id}"):
                p.unlink(missing_ok=True)

    def job_ids(self, kid: str) -> list[str]:
        """The key's jobs, newest first; entries whose folder is gone are dropped."""
        folder = self.folder(kid)
        if not folder.is_dir():
            return []
        out, seen = [], set()
        for name in sorted(os.listdir(folder), reverse=True):
            job_id = name.partition("-")[2]
            if job_id in seen:  # two replicas building the index at once
                continue
            seen.add(job_id)
            if (self.storage.jobs_dir / job_id).is_dir():
                out.append(job_id)
            else:
                (folder / name).unlink(missing_ok=True)
        return out

    def rename_key(self, old: str, new: str) -> int:
        """Move what the index and the job folders hold under key id `old` to `new` (owner files
        first, then index entries, then the key's other files); returns the jobs moved. Safe to
        run from several replicas at once: every step is a rename or an atomic rewrite."""
        src = self.root / old
        if not src.is_dir():
            return 0
        moved = 0
        jobs = src / "jobs"
        for entry in sorted(jobs.iterdir()) if jobs.is_dir() else []:
            self.folder(new).mkdir(parents=True, exist_ok=True)
            try:
                os.replace(entry, self.folder(new) / entry.name)
                moved += 1
            except FileNotFoundError:
                pass
        (self.root / new).mkdir(parents=True, exist_ok=True)
        for other in src.iterdir():
            if other.name != "jobs" and not (self.root / new / other.name).exists():
                os.replace(other, self.root / new / other.name)
        shutil.rmtree(src, ignore_errors=True)
        return moved

    def rename_keys(self, renames: dict[str, str]) -> int:
        """`rename_key` for each (old id -> id); jobs moved in all."""
        return sum(self.rename_key(old, new) for old, new in renames.items() if old != new)

    def build_once(self) -> None:
        """Index jobs made before the index existed (their owner files say whose they are)."""
        marker = self.root / ".built"
        if marker.exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        for job_id in self.storage.job_ids():
            try:
                owner = (self.storage.paths(job_id).root / OWNER_FILE).read_text().strip()
            except OSError:
                continue
            if owner and not list(self.folder(owner).glob(f"*-{job_id}")):
                self.add(owner, job_id)
        marker.touch()


class Quotas:
    def __init__(self, storage: LocalStorage, store: JobStore, settings):
        self.storage = storage
        self.store = store
        self.settings = settings
        self.index = KeyIndex(storage)
        self.redis = None
        if settings.redis_url:
            import redis

            self.redis = redis.Redis.from_url(settings.redis_url, socket_timeout=10)

    # -- the per-key lock and hourly window ----------------------------------------------------
    @contextmanager
    def _locked(self, kid: str) -> Iterator[None]:
        if self.redis is not None:
            with self.redis.lock(f"nf:quota:{kid}:lock", timeout=30, blocking_timeout=30):
                yield
            return
        folder = self.storage.data_dir / "keys" / kid
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _window(self, kid: str, now: float) -> list[float]:
        """Submission times in the last hour (caller holds the lock)."""
        if self.redis is not None:
            key = f"nf:quota:{kid}:submitted"
            self.redis.zremrangebyscore(key, "-inf", now - HOUR)
            return [float(s) for _, s in self.redis.zrange(key, 0, -1, withscores=True)]
        f = self.storage.data_dir / "keys" / kid / "submitted.json"
        try:
            times = json.loads(f.read_text())
        except (FileNotFoundError, ValueError):
            times = []
        return [t for t in times if t > now - HOUR]

    def _record(self, kid: str, now: float, window: list[float], job_id: str) -> None:
        if self.redis is not None:
            key = f"nf:quota:{kid}:submitted"
            self.redis.zadd(key, {job_id: now})
            self.redis.expire(key, int(HOUR) + 60)
            return
        atomic_write_json(self.storage.data_dir / "keys" / kid / "submitted.json", [*window, now])

    # -- reads ---------------------------------------------------------------------------------
    def jobs_of(self, kid: str) -> Iterator[tuple[str, Job | None]]:
        """(job id, job) for the key's jobs, newest first; job None while its upload runs."""
        for job_id in self.index.job_ids(kid):
            try:
                yield job_id, self.store.get(job_id)
            except (JobNotFound, ValueError):
                yield job_id, None

    def stored_bytes(self, kid: str) -> int:
        return sum(_dir_bytes(self.storage.paths(j).root) for j in self.index.job_ids(kid))

    # -- admission -----------------------------------------------------------------------------
    def admit(self, key: ApiKey) -> Admission:
        """Check the key's quotas and reserve a job folder (owner recorded, indexed), or raise
        QuotaExceeded naming the setting (503 when Redis, which holds the quota state and the
        job queue, cannot be reached)."""
        if self.redis is None:
            return self._admit(key)
        import redis

        try:
            return self._admit(key)
        except redis.RedisError as exc:
            # The exception names Redis' host and port: logged, never sent to the client.
            log.warning("quota check failed: %s", exc)
            raise QuotaExceeded(
                503, f"the job queue is unavailable ({type(exc).__name__})"
            ) from None

    def _admit(self, key: ApiKey) -> Admission:
        s = self.settings
        with self._locked(key.id):
            active = sum(
                1
                for job_id, job in self.jobs_of(key.id)
                if (job is None and self.storage.paths(job_id).root.is_dir())
                or (job is not None and job.status in ACTIVE)
            )
            if active >= s.quota_active_jobs:
                raise QuotaExceeded(
                    429,
                    f"this API key has {active} queued or running jobs, the limit is "
                    f"{s.quota_active_jobs} (QUOTA_ACTIVE_JOBS); wait for one to finish",
                    retry_after=30,
                )
            now = time.time()
            window = self._window(key.id, now)
            if len(window) >= s.quota_jobs_per_hour:
                raise QuotaExceeded(
                    429,
                    f"this API key submitted {len(window)} jobs in the last hour, the limit is "
                    f"{s.quota_jobs_per_hour} (QUOTA_JOBS_PER_HOUR)",
                    retry_after=min(window) + HOUR - now,
                )
            used = self.stored_bytes(key.id)
            cap = int(s.quota_stored_mb * 1024 * 1024)
            if used >= cap:
                raise QuotaExceeded(
                    413,
                    f"this API key's jobs use {used} bytes of disk, the limit is {cap} "
                    f"(QUOTA_STORED_MB); delete finished jobs first",
                )
            job_id, paths = self.storage.new_job_dir()
            record_owner(self.store, job_id, key)  # before the job exists: never ownerless
            self.index.add(key.id, job_id)
            self._record(key.id, now, window, job_id)
            return Admission(job_id, paths, cap - used)

    def forget(self, key: ApiKey, job_id: str) -> None:
        self.index.remove(key.id, job_id)
