"""Where job files live. `LocalStorage` keeps everything under DATA_DIR; an object-store
implementation would provide the same methods (see docs/deploy.md)."""

from __future__ import annotations

import abc
import fcntl
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def parse_job_id(job_id: str) -> str:
    """Canonical UUID string; raises ValueError for anything else, so ids never reach a path raw."""
    return str(uuid.UUID(str(job_id)))


@dataclass(frozen=True)
class JobPaths:
    root: Path

    @property
    def job_json(self) -> Path:
        return self.root / "job.json"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    @property
    def cancel(self) -> Path:
        return self.root / "cancel"

    @property
    def upload(self) -> Path:
        return self.root / "upload"

    @property
    def dataset(self) -> Path:
        return self.root / "dataset"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def events(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def exports(self) -> Path:
        return self.root / "exports"

    @property
    def renders(self) -> Path:
        """Path jobs' state files (core/path_jobs.py)."""
        return self.root / "renders"


# -- the checkpoint file layout (`<job>/checkpoints/`) ----------------------------------------
# step-<n>.safetensors (tensors) + step-<n>.json (meta, written first: tensors without meta are
# incomplete), and `latest`, a text file holding the newest step, switched by rename. The worker
# writes and loads them (worker/checkpoints.py); the API streams them (routes/artifacts.py).
CHECKPOINT_RE = re.compile(r"^step-(\d+)\.safetensors$")
LATEST_NAME = "latest"


def checkpoint_tensors(folder: Path, step: int) -> Path:
    return Path(folder) / f"step-{step}.safetensors"


def checkpoint_meta(folder: Path, step: int) -> Path:
    return Path(folder) / f"step-{step}.json"


def checkpoint_steps(folder: Path) -> list[int]:
    """Steps with a tensor file in `folder`, newest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(
        (int(m.group(1)) for p in folder.iterdir() if (m := CHECKPOINT_RE.match(p.name))),
        reverse=True,
    )


def latest_checkpoint_step(folder: Path) -> int | None:
    """The step `latest` names; without a readable pointer, the newest step on disk."""
    try:
        return int((Path(folder) / LATEST_NAME).read_text().strip())
    except (OSError, ValueError):
        steps = checkpoint_steps(folder)
        return steps[0] if steps else None


def checkpoint_order(folder: Path) -> list[int]:
    """Steps to try, best first: the `latest` one, then the others newest first (a torn newest
    file falls back to the one before)."""
    steps = checkpoint_steps(folder)
    first = latest_checkpoint_step(folder)
    return ([first] if first in steps else []) + [s for s in steps if s != first]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, default=str).encode())


class Storage(abc.ABC):
    """Where job folders live. Workers and the API see the same folders (a shared volume in
    a deployment); an object-store backend would implement these against a bucket and hand
    out local working copies as JobPaths (docs/deploy.md)."""

    @abc.abstractmethod
    def ensure(self) -> None: ...

    @abc.abstractmethod
    def paths(self, job_id: str) -> JobPaths: ...

    @abc.abstractmethod
    def new_job_dir(self) -> tuple[str, JobPaths]: ...

    @abc.abstractmethod
    def remove_job_dir(self, job_id: str) -> None: ...

    @abc.abstractmethod
    def job_ids(self) -> Iterator[str]: ...

    @abc.abstractmethod
    def writable(self) -> bool: ...


class LocalStorage(Storage):
    """Job folders under `<data_dir>/jobs/<uuid>/`."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir).resolve()
        self.jobs_dir = self.data_dir / "jobs"

    def ensure(self) -> None:
        self.jobs_dir.mkdir(parents=True, exist_ok=True)

    def paths(self, job_id: str) -> JobPaths:
        return JobPaths(self.jobs_dir / parse_job_id(job_id))

    def new_job_dir(self) -> tuple[str, JobPaths]:
        self.ensure()
        job_id = str(uuid.uuid4())
        paths = self.paths(job_id)
        paths.root.mkdir()
        return job_id, paths

    def remove_job_dir(self, job_id: str) -> None:
        shutil.rmtree(self.paths(job_id).root, ignore_errors=True)

    def job_ids(self) -> Iterator[str]:
        if not self.jobs_dir.is_dir():
            return
        for entry in os.scandir(self.jobs_dir):
            if entry.is_dir() and os.path.exists(os.path.join(entry.path, "job.json")):
                try:
                    yield parse_job_id(entry.name)
                except ValueError:
                    continue

    def writable(self) -> bool:
        try:
            self.ensure()
            probe = self.data_dir / f".probe-{uuid.uuid4().hex}"
            atomic_write_bytes(probe, b"ok")
            probe.unlink()
            return True
        except OSError:
            return False


def get_storage(settings) -> LocalStorage:
    return LocalStorage(settings.data_dir)


# An absolute path in an exception's text (FileNotFoundError and the like) shows clients the
# server's layout: a job's own files are named relative to its folder, any other by its name.
_ABS_PATH = re.compile(r"(?<![\w.:/~])/(?:[^\s'\":,()/]+/)+[^\s'\":,()/]*")
_IN_JOB = re.compile(r"/jobs/[0-9a-fA-F-]{36}/(.+)")


def without_paths(msg: str) -> str:
    """`msg` with absolute paths replaced: `dataset/x.png` for a job's files, `.../x` else."""

    def relative(m: re.Match) -> str:
        path = m.group(0)
        inside = _IN_JOB.search(path)
        return inside.group(1) if inside else ".../" + path.rstrip("/").rsplit("/", 1)[-1]

    return _ABS_PATH.sub(relative, msg)


@contextmanager
def flock(path: Path, blocking: bool = True) -> Iterator[bool]:
    """An exclusive flock on `path` (created if missing) held for the block; yields False at once
    instead of waiting when `blocking` is off and another process holds it."""
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
