"""A worker host's bounded cache of job working copies (object storage only).

With S3 storage a task works in `storage.work_dir(job_id)`, a folder under SCRATCH_DIR that it
fills with `pull` and publishes with `push`. Those folders are a cache: each task holds its
job's folder in use (a shared flock on `.in-use` inside it) for as long as it runs, and on
entry the least recently used folders nobody holds are deleted until the cache fits
SCRATCH_MAX_GB. The locks are local to the host, as the cache is. With local storage the work
dir is the job folder itself: nothing here applies and nothing is ever deleted."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.storage import JobPaths, LocalStorage, Storage, disk_bytes

log = logging.getLogger(__name__)
IN_USE = ".in-use"  # flocked shared by each task using the folder, exclusively by eviction
USED = ".used"  # its mtime is the folder's last use
_last_eviction: dict[Path, float] = {}  # cache folder -> this process's last pass over it


def is_local(storage: Storage) -> bool:
    """True where the work dir is the job's own folder (push/pull are no-ops)."""
    return isinstance(storage, LocalStorage)


@contextmanager
def job_work_dir(
    storage: Storage, job_id: str, max_bytes: int | None, evict_every_s: float = 0.0
) -> Iterator[JobPaths]:
    """The job's working copy, held in use for the block; with object storage, evicts other
    folders first so the cache stays within `max_bytes` (None: unbounded). Measuring the cache
    walks every file in it, so a process does it at most once per `evict_every_s`."""
    paths = storage.work_dir(job_id)
    if is_local(storage):
        yield paths
        return
    fh = _hold(paths.root)
    try:
        _touch(paths.root)
        cache, now = paths.root.parent, time.monotonic()
        last = _last_eviction.get(cache)
        if max_bytes is not None and (last is None or now - last >= evict_every_s):
            _last_eviction[cache] = now
            evict(cache, max_bytes)
        yield paths
    finally:
        try:
            _touch(paths.root)
        except OSError:
            pass  # the job's folder went with a delete of the job
        fh.close()


def _hold(root: Path):
    """A shared lock on root/.in-use, taken on the file that is still there: an eviction may
    have deleted the folder between our open and our lock, in which case start again."""
    while True:
        root.mkdir(parents=True, exist_ok=True)
        fh = open(root / IN_USE, "a+")
        fcntl.flock(fh, fcntl.LOCK_SH)
        try:
            if os.stat(root / IN_USE).st_ino == os.fstat(fh.fileno()).st_ino:
                return fh
        except FileNotFoundError:
            pass
        fh.close()


def _touch(root: Path) -> None:
    (root / USED).touch()


def _last_use(folder: Path) -> float:
    try:
        return (folder / USED).stat().st_mtime
    except OSError:
        return folder.stat().st_mtime


def evict(cache: Path, max_bytes: int) -> list[str]:
    """Delete the least recently used job folders under `cache` that no task holds until the
    rest fits `max_bytes`; returns the names deleted. A held folder is never touched, even
    when the held ones alone are over the bound."""
    try:
        # dot-names are folders being evicted by someone else
        folders = [p for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except FileNotFoundError:
        return []
    sizes = {f: disk_bytes(f) for f in folders}
    total = sum(sizes.values())
    deleted: list[str] = []
    for folder in sorted(folders, key=_last_use):
        if total <= max_bytes:
            break
        if _delete_unless_held(folder):
            total -= sizes[folder]
            deleted.append(folder.name)
    if deleted:
        log.info(
            "scratch cache over %.2f GB: evicted %d job folder(s) (%s)",
            max_bytes / 1e9,
            len(deleted),
            ", ".join(n[:8] for n in deleted),
        )
    return deleted


def _delete_unless_held(folder: Path) -> bool:
    try:
        fh = open(folder / IN_USE, "a+")
    except FileNotFoundError:
        return False  # deleted meanwhile by another worker process
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        # Moved aside first, so a task that opens the folder next finds it absent, not half gone.
        trash = folder.with_name(f".evicted-{folder.name}-{time.monotonic_ns()}")
        try:
            folder.rename(trash)
        except OSError:
            return False
    shutil.rmtree(trash, ignore_errors=True)
    return True
