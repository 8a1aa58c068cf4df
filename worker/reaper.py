"""Poison and stranded work: trainings, SfM stages, exports and render jobs.

Deliveries: every delivery of a training, an export or a render job that gets its lease
(core/leases.py) is counted on the lease row and marked open until it ends (however it ends,
short of its process dying). A delivery that finds the mark still open knows its predecessor's
worker was lost (OOM, segfault, SIGKILL); after MAX_WORKER_LOSSES of those the work fails
instead of taking the next worker down too.

Leases: while a job trains (or runs its SfM stage), an export runs or a render job renders,
its worker renews the lease's expiry every LEASE_TTL_S / 4. Work marked running whose lease ran
out has nobody working on it. Rounds judge by the expiry alone; a redelivered message, and a
worker starting on the host where its predecessor died, also take leases whose holder is a dead
process of their host at once.

Reaper: a timer in each train worker; one of them, on any host, runs each round (it holds the
`reaper` lease for REAPER_INTERVAL_S). A round sends again: running work whose lease ran out,
and queued work older than QUEUED_GRACE_S that the broker no longer holds (a Redis that lost its
queue, an API that died between recording the work and sending its task) — to the queue it is
waiting in (a scene job waiting for its SfM goes to `preprocess`, never to `train`). It fails
render jobs running past MAX_RENDER_JOB_S, and removes uploads a crashed API left behind (their
reserved rows and files).
Candidates come from the status indexes of the jobs, exports and renders tables (rows locked
with `FOR UPDATE SKIP LOCKED` on PostgreSQL), so a round costs the same however many finished
jobs there are. Sending work twice is harmless: its lease lets one delivery run it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import and_, or_, select

from api_schemas.jobs import JobStatus
from api_schemas.tasks import (
    ExportTask,
    PreprocessTask,
    RenderFrameJobTask,
    RenderPathJobTask,
    TrainTask,
)
from core import leases
from core.celery_config import (
    EXPORT_QUEUE,
    PREPROCESS_QUEUE,
    RENDER_QUEUE,
    TRAIN_QUEUE,
    broker_dirs,
    send,
    task_id_for,
)
from core.db.engine import db_now, session
from core.db.exports import ExportRow
from core.db.jobs import JobRow
from core.db.leases import EXPORT, REAPER, RENDER, TRAIN, Lease
from core.db.renders import RenderRow
from core.exports import lease_subject
from core.store import JobStore

log = logging.getLogger(__name__)
REAPER_SUBJECT = "round"
QUEUES = (TRAIN_QUEUE, PREPROCESS_QUEUE, RENDER_QUEUE, EXPORT_QUEUE)
STARTUP_GRACE_S = 2.0  # at most this long between an API making a job and sending its task


# -- what the broker holds -------------------------------------------------------------------
def _task_id(raw: bytes | str) -> str | None:
    try:
        msg = json.loads(raw)
        if isinstance(msg, list):  # kombu's Redis `unacked` entries: [message, exchange, key]
            msg = msg[0]
        return msg["headers"]["id"]
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def broker_task_ids(settings) -> set[str] | None:
    """Task ids of background messages waiting in (or taken but unacked from) the broker's
    train, preprocess and render queues; None when that cannot be told, in which case nothing
    is re-sent on its account."""
    try:
        if settings.redis_url:
            import redis

            r = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
            raws: list = []
            # kombu's priority lists: "train", "train\x06\x163", ...
            for queue in sorted(set(QUEUES)):
                for name in r.scan_iter(match=queue + "*", count=100):
                    if r.type(name) == b"list":
                        raws += r.lrange(name, 0, -1)
            raws += r.hvals("unacked")
        else:
            folder = broker_dirs(settings)["queue"]
            raws = []
            for p in folder.iterdir():
                try:
                    raws.append(p.read_bytes())
                except FileNotFoundError:
                    continue  # taken meanwhile
    except Exception:
        log.warning("could not read the broker's queue", exc_info=True)
        return None
    return {i for i in map(_task_id, raws) if i}


# -- candidates ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resend:
    """One message to send again."""

    task: Any
    queue: str
    why: str  # "lost worker" | "lost message"


def _skip_locked(q, *of):
    return q.with_for_update(skip_locked=True, of=of or None)


def _unfinished(s, row_type, grace):
    """Rows of `row_type` (exports, render jobs) of existing jobs that run, or wait in the queue
    since before `grace`: few whatever the number of finished ones (status index), locked for
    this round (rows another round holds are skipped)."""
    q = (
        select(row_type)
        .join(JobRow, JobRow.id == row_type.job_id)  # not of deleted jobs
        .where(
            or_(
                row_type.status == "running",
                and_(row_type.status == "queued", row_type.updated_at < grace),
            )
        )
    )
    return s.execute(_skip_locked(q, row_type)).scalars().all()


def _resend_reason(row, lease: Lease | None, task, in_broker, now, ttl: timedelta) -> str | None:
    """Why a free export or render job is sent again: "lost worker" (running, no live lease),
    "lost message" (queued, and the broker does not hold its task), else None."""
    if row.status == "running":
        return None if lease is None and row.updated_at > now - ttl else "lost worker"
    if in_broker is None or task_id_for(task) in in_broker:
        return None
    return "lost message"


def _first_task(row: JobRow):
    if (row.dataset or {}).get("sfm") == "pending":
        return PreprocessTask(job_id=row.id), PREPROCESS_QUEUE
    return TrainTask(job_id=row.id), TRAIN_QUEUE


def _recently_resent(lease: Lease | None, now, ttl: timedelta) -> bool:
    return lease is not None and lease.resent_at is not None and lease.resent_at > now - ttl


def _mark_resent(s, kind: str, subject: str, job_id: str, now) -> None:
    leases.locked(s, kind, subject, job_id).resent_at = now


def stranded_jobs(settings, in_broker: set[str] | None) -> list[Resend]:
    """Running jobs whose train lease ran out (the trainer or SfM stage died with its host),
    and queued jobs older than QUEUED_GRACE_S whose message the broker does not hold (sent to
    the stage they wait for). Marks them re-sent."""
    ttl = timedelta(seconds=settings.lease_ttl_s)
    out: list[Resend] = []
    with session(settings, write=True) as s:
        now = db_now(s)  # expiries are the database's clock
        running = s.execute(
            _skip_locked(
                select(JobRow, Lease)
                .join(Lease, and_(Lease.kind == TRAIN, Lease.subject == JobRow.id), isouter=True)
                .where(JobRow.status == JobStatus.running.value),
                JobRow,
            )
        ).all()
        grace = now - timedelta(seconds=settings.queued_grace_s)
        for job, lease in running:
            if lease is None or lease.holder is None:
                # Between stages (SfM done, its training waiting in the queue) or never
                # claimed: lost only if the broker lost its message too.
                if job.updated_at > grace or in_broker is None or job.id in in_broker:
                    continue
            elif not leases.free(lease, now, local=False):
                continue
            if _recently_resent(lease, now, ttl):
                continue
            task, queue = _first_task(job)
            _mark_resent(s, TRAIN, job.id, job.id, now)
            out.append(Resend(task, queue, "lost worker"))
        if in_broker is None:
            return out
        queued = s.execute(
            _skip_locked(
                select(JobRow, Lease)
                .join(Lease, and_(Lease.kind == TRAIN, Lease.subject == JobRow.id), isouter=True)
                .where(JobRow.status == JobStatus.queued.value, JobRow.updated_at < grace),
                JobRow,
            )
        ).all()
        for job, lease in queued:
            if job.id in in_broker or not leases.free(lease, now, local=False):
                continue
            if _recently_resent(lease, now, ttl):
                continue
            task, queue = _first_task(job)
            _mark_resent(s, TRAIN, job.id, job.id, now)
            out.append(Resend(task, queue, "lost message"))
    return out


def stranded_exports(settings, in_broker: set[str] | None) -> list[Resend]:
    """Running exports whose lease ran out, queued ones the broker lost. Sent again, each new
    delivery counts a lost worker on the lease, so the cap fails an export that kills workers."""
    ttl = timedelta(seconds=settings.lease_ttl_s)
    out: list[Resend] = []
    with session(settings, write=True) as s:
        now = db_now(s)
        grace = now - timedelta(seconds=settings.queued_grace_s)
        rows = _unfinished(s, ExportRow, grace)
        for row in rows:
            subject = lease_subject(row.job_id, row.id)
            lease = s.get(Lease, (EXPORT, subject))
            if not leases.free(lease, now, local=False) or _recently_resent(lease, now, ttl):
                continue
            task = ExportTask(job_id=row.job_id, export_id=row.id)
            why = _resend_reason(row, lease, task, in_broker, now, ttl)
            if why is None:
                continue
            _mark_resent(s, EXPORT, subject, row.job_id, now)
            out.append(Resend(task, EXPORT_QUEUE, why))
    return out


def stranded_renders(settings, in_broker: set[str] | None) -> list[Resend]:
    """Render jobs: running past MAX_RENDER_JOB_S -> failed; running with a lease that ran out,
    or queued and lost by the broker -> sent again (from the request kept with them)."""
    ttl = timedelta(seconds=settings.lease_ttl_s)
    out: list[Resend] = []
    with session(settings, write=True) as s:
        now = db_now(s)
        grace = now - timedelta(seconds=settings.queued_grace_s)
        ceiling = now - timedelta(seconds=settings.max_render_job_s) - ttl
        rows = _unfinished(s, RenderRow, grace)
        for row in rows:
            if row.status == "running" and row.created_at < ceiling:
                row.status, row.updated_at = "failed", now
                row.error = (
                    f"the render ran past its time ceiling of {settings.max_render_job_s:g} s "
                    "(MAX_RENDER_JOB_S)"
                )
                continue
            lease = s.get(Lease, (RENDER, row.id))
            if not leases.free(lease, now, local=False) or _recently_resent(lease, now, ttl):
                continue
            if row.request is None:
                row.status, row.updated_at = "failed", now
                row.error = "the render job's message was lost; ask for it again"
                continue
            cls = RenderFrameJobTask if row.kind == "frame" else RenderPathJobTask
            try:
                task = cls.model_validate(
                    {"job_id": row.job_id, "render_id": row.id, "request": row.request}
                )
            except ValidationError:  # kept by an API of another version
                row.status, row.updated_at = "failed", now
                row.error = "the render job's message was lost; ask for it again"
                continue
            why = _resend_reason(row, lease, task, in_broker, now, ttl)
            if why is None:
                continue
            _mark_resent(s, RENDER, row.id, row.job_id, now)
            out.append(Resend(task, RENDER_QUEUE, why))
    return out


# -- stale uploads ---------------------------------------------------------------------------
def _newest_mtime(root: Path) -> float:
    newest = root.stat().st_mtime
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                newest = max(newest, os.stat(os.path.join(dirpath, name)).st_mtime)
            except FileNotFoundError:
                pass
    return newest


def remove_stale_reservations(store: JobStore, settings) -> list[str]:
    """Reserved job rows (an admitted upload that never became a job: the API died mid-way)
    untouched for STALE_UPLOAD_S by the database's clock (a live upload touches its row,
    core.store's `keep_reserved`), with the files their upload left. A reservation whose local
    folder is still being written to is left alone. Each row is deleted only if it is still
    reserved and stale when judged again under its lock, and its files only after that: an
    upload completed (or touched) meanwhile keeps its row and its files, and one completed after
    finds its row gone and fails (core.store.ReservationGone), never made a job without one."""
    stale_s = settings.stale_upload_s
    candidates = []
    jobs_dir = getattr(store.storage, "jobs_dir", None)
    for job_id in store.stale_reservations(stale_s):
        root = jobs_dir / job_id if jobs_dir is not None else None
        try:
            if root is not None and root.is_dir():
                if time.time() - _newest_mtime(root) < stale_s:
                    continue
        except FileNotFoundError:
            pass
        candidates.append(job_id)
    removed = store.drop_reservations(candidates, stale_s)
    for job_id in removed:
        store.storage.delete_job(job_id)
    if removed:
        log.warning("removed %d abandoned upload(s): %s", len(removed), ", ".join(removed))
    return removed


def _has_row(store: JobStore, job_id: str) -> bool:
    with session(engine=store.engine) as s:
        return s.scalar(select(JobRow.id).where(JobRow.id == job_id)) is not None


def remove_stale_uploads(store: JobStore, stale_s: float) -> list[str]:
    """Local job folders of no job row at all, untouched for stale_s: left by versions that made
    the folder before the row. A walk of every folder, so run once at a worker's start, never
    in the periodic rounds."""
    removed: list[str] = []
    jobs_dir = getattr(store.storage, "jobs_dir", None)
    if jobs_dir is None or not jobs_dir.is_dir():
        return removed
    now = time.time()
    for entry in os.scandir(jobs_dir):
        root = Path(entry.path)
        if not entry.is_dir():
            continue
        try:
            if _has_row(store, entry.name) or now - _newest_mtime(root) < stale_s:
                continue
        except (FileNotFoundError, ValueError):
            continue
        shutil.rmtree(root, ignore_errors=True)
        removed.append(entry.name)
    if removed:
        log.warning("removed %d abandoned upload folder(s): %s", len(removed), ", ".join(removed))
    return removed


# -- the reaper ------------------------------------------------------------------------------
def stranded(settings) -> list[Resend]:
    """Everything a round would send again (and marks it re-sent)."""
    in_broker = broker_task_ids(settings)
    found = [
        *stranded_jobs(settings, in_broker),
        *stranded_exports(settings, in_broker),
        *stranded_renders(settings, in_broker),
    ]
    # Work that never started goes first: what resumes has checkpoints and has had its turn.
    return sorted(found, key=lambda r: r.why != "lost message")


def reap(app, store: JobStore, settings) -> list[Resend]:
    sent = stranded(settings)
    for r in sent:
        send(app, r.task, r.queue, ignore_result=True)
    if sent:
        log.warning(
            "reaper re-sent %d stranded task(s): %s",
            len(sent),
            ", ".join(f"{r.task.name}[{task_id_for(r.task)}] ({r.why})" for r in sent),
        )
    remove_stale_reservations(store, settings)
    return sent


def orphans(settings) -> list[Resend]:
    """At a worker's start: queued and running jobs nobody holds (their worker died with this
    host's previous worker, whose leases name dead processes), sent again at once. Queued ones
    too when the broker does not hold their message (the filesystem broker loses a taken one; a
    Redis restarted without persistence all of them), or when that cannot be told, unless made
    within the last QUEUED_GRACE_S (at most STARTUP_GRACE_S)."""
    in_broker = broker_task_ids(settings) or set()
    out = []
    with session(settings) as s:
        now = db_now(s)
        rows = s.execute(
            select(JobRow, Lease)
            .join(Lease, and_(Lease.kind == TRAIN, Lease.subject == JobRow.id), isouter=True)
            .where(JobRow.status.in_((JobStatus.queued.value, JobStatus.running.value)))
        ).all()
        grace = now - timedelta(seconds=min(settings.queued_grace_s, STARTUP_GRACE_S))
        for job, lease in rows:
            # A job made a moment ago may not have been sent yet: the rounds see to it later.
            if job.status == JobStatus.queued.value and (
                job.id in in_broker or job.updated_at > grace
            ):
                continue
            if leases.free(lease, now):
                task, queue = _first_task(job)
                out.append(Resend(task, queue, job.status))
    return out


def start_reaper(app, store_factory, settings) -> threading.Thread:
    def loop() -> None:
        while True:
            time.sleep(settings.reaper_interval_s)
            try:
                # One reaper per round on any host: the lease is left to run out, not released.
                mine = leases.claim(
                    settings, REAPER, REAPER_SUBJECT, settings.reaper_interval_s * 0.9, count=False
                )
                if mine is not None:
                    reap(app, store_factory(), settings)
            except Exception:
                log.exception("reaper round failed")

    thread = threading.Thread(target=loop, name="nf-reaper", daemon=True)
    thread.start()
    return thread
