"""Import a DATA_DIR of job folders (the file layout of earlier versions) into the database and
the storage of this deployment: `nf db import [DATA_DIR]` (service/admin/db.py).

A job folder `<DATA_DIR>/jobs/<uuid>/` held its state as files: `job.json`, `events.jsonl`,
`owner` (the owning key's id), `cancel`, `exports/<id>.json`, `renders/<id>.json`, its callback
`webhook.json` and delivery log `webhooks/<n>.json`, beside its files (`upload/`, `dataset/`,
`checkpoints/`, `artifacts/`). The state files become rows (jobs, job_events, exports, renders,
webhook_jobs, webhook_deliveries, job_storage); every other file is stored under its relative
path as key. A checkpoint pointer (`checkpoints/latest`) is stored after every other file, and a
job's rows are written in one transaction after all of its files: a job row that exists means
its import is complete, which is what makes a second run skip it and change nothing. Keys'
webhook settings (`keys/<id>/webhook.json`: URL and signing secret) become webhook_keys rows,
where the key has none yet.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from api_schemas.exports import Export
from api_schemas.jobs import Job
from api_schemas.webhooks import WebhookDelivery
from core.db import migrate
from core.db.engine import database_url, session
from core.db.exports import ExportRow
from core.db.jobs import JobEventRow, JobRow
from core.db.quotas import JobStorage
from core.db.renders import RenderRow
from core.db.secrets import KEY_ID_SECRET_NAME, get_or_make
from core.db.webhooks import WebhookDeliveryRow, WebhookJob, WebhookKey
from core.storage import LATEST_NAME, Storage, parse_job_id
from core.storage_factory import get_storage

log = logging.getLogger(__name__)

# Files of a job folder that are state (rows now) or scratch, never stored as objects.
STATE_FILES = {
    "job.json",
    "events.jsonl",
    "owner",
    "cancel",
    "webhook.json",
    ".lock",
    ".storage-manifest.json",
}
STATE_DIRS = {"exports", "renders", "webhooks"}
POINTER = f"checkpoints/{LATEST_NAME}"


@dataclass
class ImportReport:
    """What a run did: jobs imported, jobs already there, folders it could not read (with why),
    objects stored."""

    imported: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    objects: int = 0
    bytes: int = 0
    notes: list[str] = field(default_factory=list)


def _job_folders(source: Path) -> Iterator[tuple[str, Path]]:
    jobs = source / "jobs"
    if not jobs.is_dir():
        return
    for entry in sorted(jobs.iterdir()):
        if not entry.is_dir():
            continue
        try:
            job_id = parse_job_id(entry.name)
        except ValueError:
            continue
        if (entry / "job.json").is_file():
            yield job_id, entry


def job_files(folder: Path) -> list[tuple[str, Path]]:
    """(key, path) of the folder's regular files that are job files, the pointer last."""
    out = []
    for dirpath, dirs, files in os.walk(folder):
        rel_dir = Path(dirpath).relative_to(folder)
        if rel_dir == Path("."):
            dirs[:] = [d for d in dirs if d not in STATE_DIRS]
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(dirpath, d))]
        for name in files:
            path = Path(dirpath) / name
            key = (rel_dir / name).as_posix()
            if rel_dir == Path(".") and name in STATE_FILES:
                continue
            if name.startswith(".") and name.endswith(".tmp"):
                continue  # an interrupted atomic write
            if path.is_symlink() or not path.is_file():
                continue
            out.append((key, path))
    out.sort(key=lambda kp: (kp[0] == POINTER, kp[0]))
    return out


def _events(path: Path, fallback: datetime) -> list[dict[str, Any]]:
    """events.jsonl's readable lines, by id, each id once (a torn last line is dropped)."""
    out: dict[int, dict[str, Any]] = {}
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            ev = json.loads(line)
            seq = int(ev["id"])
            event = str(ev["event"])
        except (ValueError, KeyError, TypeError):
            continue
        data = ev.get("data") if isinstance(ev.get("data"), dict) else {}
        try:
            at = datetime.fromisoformat(str(data.get("updated_at")))
            at = at if at.tzinfo else fallback
        except ValueError:
            at = fallback
        out.setdefault(seq, {"seq": seq, "event": event, "data": data, "at": at})
    return [out[k] for k in sorted(out)]


def _exports(folder: Path) -> list[Export]:
    out = []
    for p in sorted((folder / "exports").glob("*.json")):
        try:
            out.append(Export.model_validate_json(p.read_bytes()))
        except (OSError, ValueError):
            log.warning("export state %s unreadable; not imported", p)
    return out


def _renders(folder: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted((folder / "renders").glob("*.json")):
        try:
            state = json.loads(p.read_text())
            state["created_at"] = datetime.fromisoformat(state["created_at"])
            state["updated_at"] = datetime.fromisoformat(state["updated_at"])
            out.append(state)
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("render state %s unreadable; not imported", p)
    return out


def _store_files(storage: Storage, job_id: str, files: list[tuple[str, Path]]) -> tuple[int, int]:
    """Store the files the storage does not hold at the same size; (objects, bytes) stored."""
    present = {o.key: o.size for o in storage.list(job_id)}
    n = nbytes = 0
    for key, path in files:
        size = path.stat().st_size
        if present.get(key) == size:
            continue
        storage.put_file(job_id, key, path)
        n, nbytes = n + 1, nbytes + size
    return n, nbytes


def _webhooks(folder: Path, job_id: str) -> list:
    """The job's callback URL and its delivery log as rows."""
    out: list = []
    try:
        url = json.loads((folder / "webhook.json").read_text()).get("url")
    except (OSError, ValueError, AttributeError):
        url = None
    if url:
        out.append(WebhookJob(job_id=job_id, url=url))
    for p in sorted((folder / "webhooks").glob("*.json")):
        try:
            d = WebhookDelivery.model_validate_json(p.read_bytes())
            seq = int(d.id)
        except (OSError, ValueError):
            log.warning("webhook delivery %s unreadable; not imported", p)
            continue
        out.append(
            WebhookDeliveryRow(
                job_id=job_id,
                seq=seq,
                url=d.url,
                event=d.event.model_dump(mode="json"),
                status=d.status.value,
                attempts=[a.model_dump(mode="json") for a in d.attempts],
                next_attempt_at=d.next_attempt_at,
                created_at=d.event.created_at,
            )
        )
    return out


def _rows(
    job: Job, folder: Path, stored_bytes: int
) -> tuple[JobRow, list[JobEventRow], list, list]:
    data = job.model_dump(mode="json")
    try:
        owner = (folder / "owner").read_text().strip() or None
    except FileNotFoundError:
        owner = None
    events = _events(folder / "events.jsonl", job.updated_at)
    row = JobRow(
        id=job.id,
        kind=data["kind"],
        status=data["status"],
        owner=owner,
        created_at=job.created_at,
        updated_at=job.updated_at,
        config=data["config"],
        dataset=data["dataset"],
        metrics=data["metrics"],
        progress=data["progress"],
        error=job.error,
        cancel_requested=(folder / "cancel").exists(),
        last_seq=max((e["seq"] for e in events), default=0),
    )
    event_rows = [
        JobEventRow(
            job_id=job.id, seq=e["seq"], event=e["event"], data=e["data"], created_at=e["at"]
        )
        for e in events
    ]
    exports = [
        ExportRow(
            job_id=job.id,
            id=e.id,
            format=e.format.value,
            options=e.options,
            status=e.status.value,
            artifact=e.artifact,
            url=e.url,
            size=e.size,
            stats=e.stats,
            error=e.error,
            created_at=e.created_at,
            updated_at=e.updated_at,
        )
        for e in _exports(folder)
    ]
    renders = [
        RenderRow(
            id=r["id"],
            job_id=job.id,
            kind=r.get("kind", "path"),
            status=r["status"],
            format=r["format"],
            n_frames=int(r.get("n_frames") or 0),
            frames_done=int(r.get("frames_done") or 0),
            n_pixels=r.get("n_pixels"),
            pixels_done=r.get("pixels_done"),
            checkpoint_step=r.get("checkpoint_step"),
            artifact=r.get("artifact"),
            error=r.get("error"),
            request=r.get("request"),
            created_at=r["created_at"],
            updated_at=r["updated_at"],
        )
        for r in _renders(folder)
    ]
    usage = JobStorage(job_id=job.id, stored_bytes=stored_bytes, updated_at=job.updated_at)
    return row, event_rows, exports, [*renders, *_webhooks(folder, job.id), usage]


def import_data_dir(source: Path, settings) -> ImportReport:
    """Import every job folder of `source` (a DATA_DIR of the file layout) into `settings`'
    database and storage; jobs already in the database are left as they are."""
    source = Path(source).resolve()
    report = ImportReport()
    migrate.upgrade(settings)
    storage = get_storage(settings)
    storage.ensure()
    for job_id, folder in _job_folders(source):
        with session(settings) as s:
            if s.scalar(select(JobRow.id).where(JobRow.id == job_id)) is not None:
                report.skipped.append(job_id)
                continue
        try:
            job = Job.model_validate_json((folder / "job.json").read_bytes())
            if job.id != job_id:
                raise ValueError(f"job.json names job {job.id}")
            files = job_files(folder)
            n, nbytes = _store_files(storage, job_id, files)
            row, events, exports, others = _rows(
                job, folder, sum(p.stat().st_size for _, p in files)
            )
            with session(settings, write=True) as s:
                s.add(row)
                s.flush()
                s.add_all([*events, *exports, *others])
        except Exception as exc:
            log.exception("job %s not imported", job_id)
            report.failed[job_id] = f"{type(exc).__name__}: {exc}"
            continue
        report.imported.append(job_id)
        report.objects += n
        report.bytes += nbytes
    _import_key_webhooks(source, settings)
    _import_id_secret(source, settings, report)
    return report


def _import_id_secret(source: Path, settings, report) -> None:
    """The key-id secret the folder's owners were made with becomes the database's, so the
    API computes the same ids (service/auth.py id_secret)."""
    path = source / "keys" / ".id-secret"
    try:
        old = path.read_text().strip()
    except OSError:
        return
    if not old or settings.key_id_secret:
        if old and settings.key_id_secret != old:
            report.notes.append(
                f"the imported owners are key ids made with the secret in {path}, but "
                f"KEY_ID_SECRET is set to another value: the keys no longer match their jobs"
            )
        return
    with session(settings, write=True) as s:
        kept = get_or_make(s, KEY_ID_SECRET_NAME, old)
    if kept != old:
        report.notes.append(
            f"the database already holds another key-id secret than {path}: the imported "
            f"owners do not match their keys"
        )


def _import_key_webhooks(source: Path, settings) -> None:
    """Keys' webhook settings (`keys/<id>/webhook.json`), for keys that have none yet."""
    for path in sorted((source / "keys").glob("*/webhook.json")):
        try:
            cfg = json.loads(path.read_text())
            url, secret = cfg.get("url"), cfg.get("secret")
        except (OSError, ValueError, AttributeError):
            log.warning("key webhook settings %s unreadable; not imported", path)
            continue
        with session(settings, write=True) as s:
            if s.get(WebhookKey, path.parent.name) is None:
                s.add(WebhookKey(owner=path.parent.name, url=url, secret=secret))


def describe(report: ImportReport, settings) -> str:
    """The report as lines for a terminal."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url(settings)).render_as_string(hide_password=True)
    lines = [
        f"database {url}, storage {settings.storage_url or settings.data_dir}",
        f"imported {len(report.imported)} jobs ({report.objects} files, {report.bytes} bytes "
        f"stored); {len(report.skipped)} already there; {len(report.failed)} failed",
    ]
    lines += [f"  failed {job_id}: {why}" for job_id, why in report.failed.items()]
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)
