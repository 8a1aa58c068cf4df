"""Safe extraction of uploaded .zip / .tar / .tar.gz archives into a job folder.

Runs in the intake child process (service/intake/sandbox.py), never in the API's own: only
`zip_entry_count` (the end record alone) runs there. Every archive is treated as hostile: names
are checked before anything is written, only regular files and folders are created, folders
count as entries whether listed or implied by a file's path, tar's pax and GNU long-name headers
are capped before tarfile reads them, a zip's central directory is walked record by record up to
MAX_ARCHIVE_ENTRIES before zipfile parses it whole, and the size limits are checked twice: once
from the headers (cheap, rejects honest-but-too-big archives before any work) and again while
streaming (headers can lie, so the bytes actually written count).
"""

from __future__ import annotations

import os
import stat
import struct
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from service.intake import IntakeError

CHUNK = 1 << 20
# A pax or GNU long-name header holds a path and a few attributes (PATH_MAX is 4096); tarfile
# reads one whole into memory, so a declared size past this is a bomb, not a name.
MAX_TAR_META_BYTES = 64 << 10
TAR_META_TYPES = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)
# What the stdlib readers raise on damaged input (zlib.error escapes zipfile and gzip unwrapped).
CORRUPT = (
    zipfile.BadZipFile,
    tarfile.TarError,
    zlib.error,
    OSError,
    EOFError,
    ValueError,
    NotImplementedError,
    RuntimeError,
    KeyError,
    struct.error,
)


@dataclass(frozen=True)
class ArchiveLimits:
    max_entries: int = 10_000
    max_total_bytes: int = 2 * 1024**3
    # Per entry and for the archive as a whole; real photos compress ~1-3x, zip bombs 1000x.
    max_ratio: float = 200.0
    # Small entries (JSON, text) may compress very well without being a threat.
    ratio_grace_bytes: int = 1 << 20


def limits_from_settings(settings) -> ArchiveLimits:
    """MAX_ARCHIVE_ENTRIES, MAX_EXTRACTED_MB and MAX_COMPRESSION_RATIO (core.settings)."""
    return ArchiveLimits(
        max_entries=settings.max_archive_entries,
        max_total_bytes=int(settings.max_extracted_mb * 1024 * 1024),
        max_ratio=settings.max_compression_ratio,
    )


def detect_kind(path: Path) -> str | None:
    """'zip', 'tar' or None, from the content (the client's file name is not trusted)."""
    with open(path, "rb") as fh:
        head = fh.read(512)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"
    if head.startswith(b"\x1f\x8b") or head.startswith(b"BZh") or head.startswith(b"\xfd7zXZ"):
        return "tar"  # compressed; tarfile finds out whether a tar is inside
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return None


def zip_entry_count(path: Path) -> int | None:
    """Entries a zip's end record declares (zip64 included), read from the file's last 64 KiB
    without parsing the central directory; None when there is no end record."""
    with open(path, "rb") as fh:
        try:
            # The stdlib's own end-record reader: stable since Python 2, private in name only.
            end = zipfile._EndRecData(fh)
        except OSError:
            return None
    return None if not end else int(end[zipfile._ECD_ENTRIES_TOTAL])


def _walk_central_directory(fh: BinaryIO, max_entries: int) -> int:
    """Count the central directory's records one header at a time, as zipfile would read them
    (its start found the same way), stopping past `max_entries`: zipfile itself reads the whole
    directory into memory and builds every ZipInfo before anyone can count them."""
    end = zipfile._EndRecData(fh)
    if not end:
        raise zipfile.BadZipFile("File is not a zip file")
    size_cd, offset_cd = end[zipfile._ECD_SIZE], end[zipfile._ECD_OFFSET]
    start = end[zipfile._ECD_LOCATION] - size_cd
    if end[zipfile._ECD_SIGNATURE] == zipfile.stringEndArchive64:
        start -= zipfile.sizeEndCentDir64 + zipfile.sizeEndCentDir64Locator
    if start < 0 or offset_cd < 0:
        raise zipfile.BadZipFile("Bad offset for central directory")
    pos, count = 0, 0
    while pos < size_cd:
        count += 1
        if count > max_entries:
            raise IntakeError(
                413, f"archive has more than {max_entries} entries (MAX_ARCHIVE_ENTRIES)"
            )
        fh.seek(start + pos)
        head = fh.read(zipfile.sizeCentralDir)
        if len(head) != zipfile.sizeCentralDir:
            raise zipfile.BadZipFile("Truncated central directory")
        rec = struct.unpack(zipfile.structCentralDir, head)
        if rec[zipfile._CD_SIGNATURE] != zipfile.stringCentralDir:
            raise zipfile.BadZipFile("Bad magic number for central directory")
        pos += (
            zipfile.sizeCentralDir
            + rec[zipfile._CD_FILENAME_LENGTH]
            + rec[zipfile._CD_EXTRA_FIELD_LENGTH]
            + rec[zipfile._CD_COMMENT_LENGTH]
        )
    return count


class _CappedTarInfo(tarfile.TarInfo):
    """Refuses a pax or GNU long-name header whose declared size is a bomb before tarfile reads
    it (it reads one whole, then copies it while parsing: a 1.5 GB pax record cost ~8 GB)."""

    def _proc_member(self, tarfile_):
        if self.type in TAR_META_TYPES and self.size > MAX_TAR_META_BYTES:
            raise IntakeError(
                413,
                f"archive has a {self.size}-byte extended (pax / long name) header; names and "
                f"attributes fit in {MAX_TAR_META_BYTES} bytes",
            )
        return super()._proc_member(tarfile_)


def safe_member_path(name: str) -> PurePosixPath | None:
    """The relative path an entry may be written to, None for an entry that names the root.

    Raises IntakeError for absolute paths, drive letters, `..` and other escapes. Backslashes are
    treated as separators because Windows tools write them and a later join could honour them.
    """
    raw = name.replace("\\", "/")
    if raw.startswith("/") or (len(raw) >= 2 and raw[1] == ":"):
        raise IntakeError(400, f"archive entry {name!r} has an absolute path")
    if "\x00" in raw:
        raise IntakeError(400, f"archive entry {name!r} has a NUL byte in its name")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise IntakeError(400, f"archive entry {name!r} points outside the archive ('..')")
    if not parts:
        return None
    return PurePosixPath(*parts)


class _Budget:
    """Counts what is really written, so lying headers cannot exceed the limits."""

    def __init__(self, limits: ArchiveLimits, archive_bytes: int):
        self.limits = limits
        self.archive_bytes = max(archive_bytes, 1)
        self.entries = 0
        self.written = 0
        self.folders: set[PurePosixPath] = set()

    def entry(self) -> None:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise IntakeError(
                413,
                f"archive has more than {self.limits.max_entries} entries, counting the folders "
                "its paths create (MAX_ARCHIVE_ENTRIES)",
            )

    def folders_of(self, rel: PurePosixPath, is_dir: bool) -> None:
        """Count every folder `rel` creates, listed or implied by a deeper path, as an entry:
        deep paths otherwise make millions of folders that no byte count sees."""
        chain = [rel] if is_dir else []
        chain += [p for p in rel.parents if p != PurePosixPath(".")]
        for folder in chain:
            if folder in self.folders:
                break  # its parents were counted with it
            self.folders.add(folder)
            if folder != rel:  # a listed folder was counted as its own entry
                self.entry()

    def declare(self, total: int) -> None:
        if total > self.limits.max_total_bytes:
            raise IntakeError(
                413,
                f"archive would extract to {total} bytes, over the limit of "
                f"{self.limits.max_total_bytes} (MAX_EXTRACTED_MB)",
            )

    def add(self, n: int) -> None:
        self.written += n
        self.declare(self.written)
        if (
            self.written > self.limits.ratio_grace_bytes
            and self.written / self.archive_bytes > self.limits.max_ratio
        ):
            raise IntakeError(
                413,
                f"archive expands more than {self.limits.max_ratio:g}x (looks like a zip bomb; "
                "MAX_COMPRESSION_RATIO)",
            )


def _check_ratio(name: str, size: int, compressed: int, limits: ArchiveLimits) -> None:
    if size > limits.ratio_grace_bytes and size / max(compressed, 1) > limits.max_ratio:
        raise IntakeError(
            413,
            f"archive entry {name!r} expands {size / max(compressed, 1):.0f}x, over the "
            f"limit of {limits.max_ratio:g}x (looks like a zip bomb; MAX_COMPRESSION_RATIO)",
        )


def _copy_stream(src: BinaryIO, target: Path, budget: _Budget, declared: int, name: str) -> None:
    written = 0
    # O_EXCL: never follow or overwrite something already there (e.g. a duplicate entry).
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as out:
        while True:
            chunk = src.read(CHUNK)
            if not chunk:
                break
            written += len(chunk)
            if written > declared:
                raise IntakeError(400, f"archive entry {name!r} is larger than its header says")
            budget.add(len(chunk))
            out.write(chunk)
    if written != declared:
        raise IntakeError(
            400, f"archive entry {name!r} is shorter than its header says (truncated archive?)"
        )


def _prepare(dest: Path, rel: PurePosixPath, name: str, is_dir: bool) -> Path:
    target = dest.joinpath(*rel.parts)
    # Belt and braces: nothing we create is a link, but check the resolved parent anyway.
    parent = target if is_dir else target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # e.g. "a" is a file and "a/b" follows
        raise IntakeError(400, f"archive entry {name!r} clashes with another entry") from None
    if not parent.resolve().is_relative_to(dest.resolve()):
        raise IntakeError(400, f"archive entry {name!r} points outside the archive")
    if not is_dir and (target.exists() or target.is_symlink()):
        raise IntakeError(400, f"archive has the entry {name!r} twice")
    return target


def _extract_zip(src: Path, dest: Path, limits: ArchiveLimits) -> list[PurePosixPath]:
    try:
        with open(src, "rb") as fh:
            _walk_central_directory(fh, limits.max_entries)
        zf = zipfile.ZipFile(src)
    except IntakeError:
        raise
    except CORRUPT as exc:
        raise IntakeError(400, f"not a readable zip archive: {exc}") from None
    budget = _Budget(limits, src.stat().st_size)
    out: list[PurePosixPath] = []
    with zf:
        infos = zf.infolist()
        if len(infos) > limits.max_entries:
            raise IntakeError(
                413,
                f"archive has {len(infos)} entries, over the limit of {limits.max_entries} "
                "(MAX_ARCHIVE_ENTRIES)",
            )
        budget.declare(sum(i.file_size for i in infos))
        plan = []
        for info in infos:
            rel = safe_member_path(info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise IntakeError(400, f"archive entry {info.filename!r} is a symbolic link")
            if mode and stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise IntakeError(400, f"archive entry {info.filename!r} is a special file")
            if info.flag_bits & 0x1:
                raise IntakeError(400, f"archive entry {info.filename!r} is encrypted")
            if not info.is_dir():
                _check_ratio(info.filename, info.file_size, info.compress_size, limits)
            plan.append((info, rel))
        for info, rel in plan:
            budget.entry()
            if rel is None:
                continue
            budget.folders_of(rel, info.is_dir())
            target = _prepare(dest, rel, info.filename, info.is_dir())
            if info.is_dir():
                continue
            try:
                with zf.open(info) as fh:
                    _copy_stream(fh, target, budget, info.file_size, info.filename)
            except IntakeError:
                raise
            except CORRUPT as exc:
                raise IntakeError(
                    400, f"archive entry {info.filename!r} is corrupt: {exc}"
                ) from None
            out.append(rel)
    return out


def _extract_tar(src: Path, dest: Path, limits: ArchiveLimits) -> list[PurePosixPath]:
    budget = _Budget(limits, src.stat().st_size)
    out: list[PurePosixPath] = []
    try:
        # Streaming mode ("r|*"): headers are read one at a time, so a huge member count or a
        # compressed bomb is stopped by the budget instead of being indexed first.
        with tarfile.open(src, mode="r|*", tarinfo=_CappedTarInfo) as tf:
            for member in tf:
                budget.entry()
                rel = safe_member_path(member.name)
                if member.issym() or member.islnk():
                    raise IntakeError(
                        400,
                        f"archive entry {member.name!r} is a "
                        f"{'symbolic' if member.issym() else 'hard'} link",
                    )
                if not (member.isreg() or member.isdir()):
                    raise IntakeError(
                        400, f"archive entry {member.name!r} is a special file (device, fifo)"
                    )
                if member.isreg():
                    budget.declare(budget.written + member.size)
                if rel is None:
                    continue
                budget.folders_of(rel, member.isdir())
                target = _prepare(dest, rel, member.name, member.isdir())
                if member.isdir():
                    continue
                fh = tf.extractfile(member)
                _copy_stream(fh, target, budget, member.size, member.name)
                out.append(rel)
    except IntakeError:
        raise
    except CORRUPT as exc:
        raise IntakeError(400, f"not a readable tar archive: {exc}") from None
    return out


def extract_archive(
    src: Path, dest: Path, limits: ArchiveLimits | None = None
) -> list[PurePosixPath]:
    """Extract `src` into the (new or empty) folder `dest`; returns the files written, relative to it.

    On error the caller should remove `dest`: a partial extraction is left there, but nothing is ever
    written outside it.
    """
    src, dest = Path(src), Path(dest)
    limits = limits or ArchiveLimits()
    dest.mkdir(parents=True, exist_ok=True)
    kind = detect_kind(src)
    if kind == "zip":
        return _extract_zip(src, dest, limits)
    if kind == "tar":
        return _extract_tar(src, dest, limits)
    raise IntakeError(415, "the upload is not a .zip or .tar(.gz) archive")
