"""Where job files live: the `Storage` interface and `LocalStorage` (a directory, the default);
S3 is core/s3_storage.py, and core/storage_factory.py's `get_storage` picks the backend
STORAGE_URL names. Also the checkpoint file layout and the atomic-write helpers both sides use."""

from __future__ import annotations

import abc
import json
import os
import re
import shutil
import stat
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO


def parse_job_id(job_id: str) -> str:
    """Canonical UUID string; raises ValueError for anything else, so ids never reach a path raw."""
    return str(uuid.UUID(str(job_id)))


@dataclass(frozen=True)
class JobPaths:
    root: Path

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
    def exports(self) -> Path:
        return self.root / "exports"


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


def stored_checkpoints(storage: Storage, job_id: str) -> list[tuple[int, int]]:
    """(step, tensor bytes) of the job's stored checkpoints, best first by `checkpoint_order`'s
    rules: the step the `latest` object names, then the others newest first."""
    sizes = {}
    for o in storage.list(job_id, "checkpoints/"):
        if m := CHECKPOINT_RE.match(o.key.removeprefix("checkpoints/")):
            sizes[int(m.group(1))] = o.size
    steps = sorted(sizes, reverse=True)
    try:
        first = int(storage.get_bytes(job_id, f"checkpoints/{LATEST_NAME}").strip())
    except (FileNotFoundError, ValueError):
        first = steps[0] if steps else None
    order = ([first] if first in sizes else []) + [s for s in steps if s != first]
    return [(s, sizes[s]) for s in order]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of it; once it returns, the new one
    survives a power cut (the file, then its folder's entry, are fsynced)."""
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
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _atomic_copy(src: Path, dest: Path) -> None:
    """Copy `src` to `dest` so readers see the old file or the whole new one."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, default=str).encode())


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object of a job: its key inside the job, size in bytes, modification time
    (seconds since the epoch)."""

    key: str
    size: int
    mtime: float


@dataclass(frozen=True)
class DirectUpload:
    """A multipart upload that clients send straight to the store: PUT part i (1-based, all
    `part_size` bytes but the last) to `part_urls[i - 1]`, keep each answer's ETag header, then
    `Storage.finish_upload` with the ETags in order."""

    upload_id: str
    part_size: int
    part_urls: list[str]


_KEY_PART = re.compile(r"^[^\x00-\x1f\\]+$")


def check_key(key: str) -> str:
    """`key` if it is a relative POSIX path inside a job (no `..`, no empty or absolute parts,
    no backslashes or control characters); ValueError otherwise, so keys never escape a job."""
    parts = str(key).split("/")
    if not key or any(p in ("", ".", "..") or not _KEY_PART.match(p) for p in parts):
        raise ValueError(f"invalid storage key {key!r}")
    return str(key)


def check_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a key's beginning (a trailing `/` is allowed)."""
    if prefix:
        check_key(prefix.rstrip("/") or ".")
    return prefix


def disk_bytes(root: Path) -> int:
    """Disk blocks under `root` (what a full disk counts), links not followed; files removed
    meanwhile count nothing."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


class Storage(abc.ABC):
    """A job's files, addressed by (job_id, key), key a relative POSIX path inside the job
    ("dataset/images/0001.png", "checkpoints/step-100.safetensors", "artifacts/mesh.glb").

    Besides its files a job has a local folder, `paths(job_id)`, always under DATA_DIR/jobs (its
    state is in the database, core/store.py). Code that computes on
    files works in `work_dir(job_id)`: `pull` fills it from storage, `push` stores what was made
    there. `LocalStorage` keeps the files in the state folder itself, so work_dir is that folder
    and pull/push cost nothing; `S3Storage` (core/s3_storage.py) keeps them in a bucket and
    work_dir is a local scratch copy."""

    # Whether clients can upload straight to the store (start_upload and the rest).
    direct_uploads = False

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir).resolve()
        self.jobs_dir = self.data_dir / "jobs"

    # -- the job's local state folder ----------------------------------------------------------
    def ensure(self) -> None:
        """Create the folders the store needs."""
        self.jobs_dir.mkdir(parents=True, exist_ok=True)

    def paths(self, job_id: str) -> JobPaths:
        """The job's local folder under DATA_DIR/jobs."""
        return JobPaths(self.jobs_dir / parse_job_id(job_id))

    def new_job_dir(self) -> tuple[str, JobPaths]:
        """A new job id with its local folder created."""
        self.ensure()
        job_id = str(uuid.uuid4())
        paths = self.paths(job_id)
        paths.root.mkdir()
        return job_id, paths

    def remove_job_dir(self, job_id: str) -> None:
        """The job's files and local folders removed (`delete_job`)."""
        self.delete_job(job_id)

    def writable(self) -> bool:
        """The state folders can be written (the readiness probe)."""
        try:
            self.ensure()
            probe = self.data_dir / f".probe-{uuid.uuid4().hex}"
            atomic_write_bytes(probe, b"ok")
            probe.unlink()
            return True
        except OSError:
            return False

    # -- files ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def put_file(self, job_id: str, key: str, src: Path) -> None:
        """Store the file `src` as `key` (readers see the old object or the new one)."""

    @abc.abstractmethod
    def put_bytes(self, job_id: str, key: str, data: bytes) -> None:
        """Store `data` as `key` (readers see the old object or the new one)."""

    @abc.abstractmethod
    def get_bytes(self, job_id: str, key: str) -> bytes:
        """The object's bytes; FileNotFoundError if there is none."""

    @abc.abstractmethod
    def download(self, job_id: str, key: str, dest: Path) -> None:
        """Write the object to `dest` (parents created, replaced whole); FileNotFoundError."""

    @abc.abstractmethod
    def open_read(self, job_id: str, key: str) -> BinaryIO:
        """A streaming reader of the object (close it); FileNotFoundError if there is none."""

    @abc.abstractmethod
    def list(self, job_id: str, prefix: str = "") -> list[ObjectInfo]:
        """The job's objects whose key starts with `prefix`, sorted by key."""

    @abc.abstractmethod
    def exists(self, job_id: str, key: str) -> bool:
        """Whether the object exists."""

    @abc.abstractmethod
    def delete(self, job_id: str, key: str) -> None:
        """Remove the object; no error if it is absent."""

    @abc.abstractmethod
    def delete_job(self, job_id: str) -> None:
        """Remove every object of the job, its working copy and its local state folder."""

    @abc.abstractmethod
    def presigned_url(
        self, job_id: str, key: str, expires_s: int = 900, filename: str | None = None
    ) -> str | None:
        """A URL that serves the object for `expires_s` seconds without credentials, as an
        attachment named `filename`; None where the backend has no such URLs (local)."""

    @abc.abstractmethod
    def work_dir(self, job_id: str) -> JobPaths:
        """The job's local working copy (keys are paths relative to its root)."""

    @abc.abstractmethod
    def pull(self, job_id: str, prefix: str) -> None:
        """Make work_dir hold the objects under `prefix` (only missing or changed ones move)."""

    @abc.abstractmethod
    def push(self, job_id: str, relpath: str) -> None:
        """Store the file or folder (recursively) at `relpath` under work_dir as objects of the
        same keys."""

    def stored_bytes(self, job_id: str) -> int:
        """Bytes the job's files take in storage (quotas)."""
        return sum(o.size for o in self.list(job_id))

    def local_path(self, job_id: str, key: str) -> Path | None:
        """The object as a regular local file, where the backend keeps it so (served directly,
        with ranges); None otherwise or when absent."""
        return None

    def start_upload(self, job_id: str, key: str, size: int, expires_s: int = 3600) -> DirectUpload:
        """Begin a direct upload of `size` bytes as `key`; NotImplementedError where the backend
        takes no direct uploads (local: files come through the API)."""
        raise NotImplementedError("direct uploads need object storage (STORAGE_URL=s3://...)")

    def upload_parts(self, job_id: str, key: str, upload_id: str) -> list[str]:
        """ETags of the parts of a direct upload received so far, by part number (a gap ends
        the list); FileNotFoundError when there is no such upload."""
        raise NotImplementedError("direct uploads need object storage (STORAGE_URL=s3://...)")

    def finish_upload(self, job_id: str, key: str, upload_id: str, etags: list[str]) -> ObjectInfo:
        """Assemble the uploaded parts into the object; ValueError when the parts do not match
        what was uploaded (missing, wrong ETag, too small), FileNotFoundError when there is no
        such upload (finished or aborted)."""
        raise NotImplementedError("direct uploads need object storage (STORAGE_URL=s3://...)")

    def abort_upload(self, job_id: str, key: str, upload_id: str) -> None:
        """Drop a direct upload and the parts sent so far (no error if it is gone)."""
        raise NotImplementedError("direct uploads need object storage (STORAGE_URL=s3://...)")

    def evict(self, job_id: str) -> None:
        """Drop the job's local working copy where it is only a cache (nothing is lost)."""
        return None


class LocalStorage(Storage):
    """Job files in the state folder itself, `<root>/jobs/<uuid>/<key>` (root: DATA_DIR unless
    STORAGE_URL=file:///root)."""

    def __init__(self, data_dir: Path, root: Path | None = None):
        super().__init__(data_dir)
        if root is not None:
            self.jobs_dir = Path(root).resolve() / "jobs"

    def _file(self, job_id: str, key: str) -> Path:
        return self.paths(job_id).root / check_key(key)

    def _readable(self, job_id: str, key: str) -> Path:
        """The object's file, refused (FileNotFoundError) when it is missing, not a regular file,
        or reached through a link that leaves the job's folder."""
        path = self._file(job_id, key)
        root = self.paths(job_id).root.resolve()
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            raise FileNotFoundError(f"{key}: no such object") from None
        if not real.is_relative_to(root) or not real.is_file():
            raise FileNotFoundError(f"{key}: no such object")
        return real

    def put_file(self, job_id: str, key: str, src: Path) -> None:
        dest = self._file(job_id, key)
        if dest.exists() and os.path.samefile(src, dest):
            return
        _atomic_copy(src, dest)

    def put_bytes(self, job_id: str, key: str, data: bytes) -> None:
        atomic_write_bytes(self._file(job_id, key), data)

    def get_bytes(self, job_id: str, key: str) -> bytes:
        return self._readable(job_id, key).read_bytes()

    def download(self, job_id: str, key: str, dest: Path) -> None:
        src = self._readable(job_id, key)
        dest = Path(dest)
        if dest.exists() and os.path.samefile(src, dest):
            return
        _atomic_copy(src, dest)

    def open_read(self, job_id: str, key: str) -> BinaryIO:
        return open(self._readable(job_id, key), "rb")

    def list(self, job_id: str, prefix: str = "") -> list[ObjectInfo]:
        check_prefix(prefix)
        root = self.paths(job_id).root
        start = root / prefix.rsplit("/", 1)[0] if "/" in prefix else root
        out = []
        for dirpath, dirs, files in os.walk(start):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
            for name in files:
                path = os.path.join(dirpath, name)
                key = os.path.relpath(path, root).replace(os.sep, "/")
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.lstat(path)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out.append(ObjectInfo(key, st.st_size, st.st_mtime))
        return sorted(out, key=lambda o: o.key)

    def exists(self, job_id: str, key: str) -> bool:
        try:
            self._readable(job_id, key)
        except FileNotFoundError:
            return False
        return True

    def delete(self, job_id: str, key: str) -> None:
        self._file(job_id, key).unlink(missing_ok=True)

    def delete_job(self, job_id: str) -> None:
        shutil.rmtree(self.paths(job_id).root, ignore_errors=True)

    def presigned_url(
        self, job_id: str, key: str, expires_s: int = 900, filename: str | None = None
    ) -> str | None:
        return None

    def work_dir(self, job_id: str) -> JobPaths:
        return self.paths(job_id)

    def pull(self, job_id: str, prefix: str) -> None:
        check_prefix(prefix)

    def push(self, job_id: str, relpath: str) -> None:
        if not (self.paths(job_id).root / check_key(relpath)).exists():
            raise FileNotFoundError(f"{relpath}: not in the job's working copy")

    def stored_bytes(self, job_id: str) -> int:
        return disk_bytes(self.paths(job_id).root)

    def local_path(self, job_id: str, key: str) -> Path | None:
        try:
            return self._readable(job_id, key)
        except FileNotFoundError:
            return None


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
