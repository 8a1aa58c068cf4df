"""Every upload is inspected in a child process with memory, CPU-time and file-size limits.

Parsing a hostile file (tar and zip headers, pose files, photos through Pillow and libheif,
videos through FFmpeg) can ask for gigabytes or hang; in the API process that would stall or
kill every tenant's requests. The API only streams the upload to disk and does what reads a few
bytes (`precheck`: empty file, a zip end record's entry count); `run_intake` then runs the kind's
`validate_upload` as `python -m service.intake.sandbox` under
- RLIMIT_AS = INTAKE_MEMORY_MB (an allocation past it is a MemoryError: 422),
- RLIMIT_CPU = INTAKE_TIMEOUT_S, and the same wall-clock limit (422),
- RLIMIT_FSIZE = the larger of MAX_EXTRACTED_MB and MAX_UPLOAD_MB (one file past it: EFBIG),
with no secret in its environment and parent-death SIGKILL, and takes back an `IntakeResult`.
The child writes the normal form into the job folder exactly as an in-process call would.
"""

from __future__ import annotations

import logging
import math
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from core.process import child_env, child_pythonpath, set_parent_death_signal
from core.settings import Settings
from service.intake import IntakeError
from service.intake.archive import detect_kind, zip_entry_count

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
# Settings the child does not need and must not see (tokens, URLs that may carry passwords).
SECRET_FIELD = re.compile(r"key|secret|token|password|redis_url", re.IGNORECASE)


class IntakeRequest(BaseModel):
    """What the API hands the child (stdin, JSON)."""

    kind: str
    src_path: str
    filename: str
    config: dict[str, Any]
    job_dir: str
    settings: dict[str, Any]  # Settings fields, secrets left out
    parent_pid: int


class IntakeResult(BaseModel):
    """What the child hands back (a file, JSON): the intake's answer or the client's mistake."""

    config: dict[str, Any] | None = None
    dataset: dict[str, Any] = {}
    status_code: int | None = None  # set with `detail` when the upload is refused
    detail: str | None = None


def precheck(src: Path, settings: Settings) -> None:
    """What the API checks itself: a few bytes of the file, never a parse of its contents."""
    if src.stat().st_size == 0:
        raise IntakeError(422, "the uploaded file is empty")
    if detect_kind(src) == "zip":
        n = zip_entry_count(src)
        if n is not None and n > settings.max_archive_entries:
            raise IntakeError(
                413,
                f"archive has {n} entries, over the limit of {settings.max_archive_entries} "
                "(MAX_ARCHIVE_ENTRIES)",
            )


def _child_settings(settings: Settings) -> dict[str, Any]:
    data = settings.model_dump(mode="json")
    return {k: v for k, v in data.items() if not SECRET_FIELD.search(k)}


def _refusal(rc: int, stderr: str, settings: Settings) -> Exception:
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):
        return IntakeError(
            422,
            f"the upload took longer than {settings.intake_timeout_s:g} s to inspect "
            "(INTAKE_TIMEOUT_S)",
        )
    if rc < 0:
        return IntakeError(
            422,
            f"the upload could not be read: its inspection crashed ({signal.Signals(-rc).name})",
        )
    log.error("intake child failed with exit status %s:\n%s", rc, stderr)
    return RuntimeError(f"the intake child failed with exit status {rc}")


def _tail(path: Path, n: int = 4000) -> str:
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - n))
        return fh.read().decode(errors="replace")


def run_intake(
    kind: str, src_path: Path, filename: str, config: dict[str, Any], job_dir: Path, settings
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`service.intake.<kind>.validate_upload` in the limited child: (effective config, dataset
    summary), or IntakeError with the child's status and detail."""
    src_path, job_dir = Path(src_path), Path(job_dir)
    precheck(src_path, settings)
    request = IntakeRequest(
        kind=kind,
        src_path=str(src_path.resolve()),
        filename=filename,
        config=config,
        job_dir=str(job_dir.resolve()),
        settings=_child_settings(settings),
        parent_pid=os.getpid(),
    )
    out = src_path.parent / ".intake-result.json"
    # FFmpeg and friends may log without end on a hostile file: to a file, never to our memory.
    log_path = src_path.parent / ".intake-stderr"
    env = {**child_env(), "PYTHONPATH": child_pythonpath(REPO_ROOT)}
    with open(log_path, "wb") as stderr:
        # Its own process group: a timeout also ends what it started (the COLMAP reader).
        proc = subprocess.Popen(
            [sys.executable, "-m", "service.intake.sandbox", str(out)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            cwd=str(job_dir),
            start_new_session=True,
        )
        try:
            proc.communicate(request.model_dump_json().encode(), settings.intake_timeout_s + 5)
        except BaseException:  # the wall clock ran out, or this thread is being torn down
            os.killpg(proc.pid, signal.SIGKILL)  # not reaped yet: the group is still ours
            proc.wait()
            if not isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
                raise
        rc = proc.returncode
    if rc != 0 or not out.is_file():
        raise _refusal(rc, _tail(log_path), settings)
    result = IntakeResult.model_validate_json(out.read_text())
    out.unlink()
    if result.status_code is not None:
        raise IntakeError(result.status_code, result.detail or "the upload was refused")
    return result.config or {}, result.dataset


def _limit(which: int, value: int) -> None:
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value if which != resource.RLIMIT_CPU else value + 5))


def _child(out: Path) -> None:
    request = IntakeRequest.model_validate_json(sys.stdin.read())
    set_parent_death_signal(signal.SIGKILL, expected_parent=request.parent_pid)
    settings = Settings(**request.settings)
    _limit(resource.RLIMIT_AS, int(settings.intake_memory_mb) << 20)
    _limit(resource.RLIMIT_CPU, max(1, math.ceil(settings.intake_timeout_s)))
    _limit(
        resource.RLIMIT_FSIZE,
        max(int(settings.max_extracted_mb * 1024 * 1024), settings.max_upload_bytes) + (1 << 20),
    )
    # A write past RLIMIT_FSIZE fails with EFBIG instead of killing the child.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    from service.intake.registry import get_kind

    spec = get_kind(request.kind)
    try:
        if spec is None:
            raise IntakeError(422, f"unknown kind {request.kind!r}")
        got = spec.intake.validate_upload(
            Path(request.src_path),
            request.filename,
            request.config,
            Path(request.job_dir),
            settings,
        )
        effective, info = got if isinstance(got, tuple) else (got, {})
        result = IntakeResult(config=effective, dataset=info)
    except IntakeError as exc:
        result = IntakeResult(status_code=exc.status_code, detail=exc.detail)
    except MemoryError:
        result = IntakeResult(
            status_code=422,
            detail="inspecting the upload needs more memory than the "
            f"{settings.intake_memory_mb:g} MiB allowed (INTAKE_MEMORY_MB)",
        )
    out.write_text(result.model_dump_json())


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
