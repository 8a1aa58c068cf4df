"""Poison and stranded trainings.

Deliveries: every nf.train delivery that gets the train lock is counted in `<job>/.delivery.json`
and marked open until it ends (however it ends, short of its process dying). A delivery that
finds the mark still open knows its predecessor's worker was lost (OOM, segfault, SIGKILL);
after MAX_WORKER_LOSSES of those the job fails instead of taking the next worker down too.

Lease: while a job trains, its trainer touches `<job>/.lease` every LEASE_TTL_S / 4. A `running`
job whose lease is older than LEASE_TTL_S and whose train lock is free has nobody training it.

Reaper: a timer in each train worker (every REAPER_INTERVAL_S, one worker at a time) sends such
jobs again, re-sends `queued` jobs the broker no longer holds (a Redis that lost its queue, an
API that died between writing job.json and sending the task), and removes upload folders a
crashed API left behind. Sending a job twice is harmless: the train lock lets one delivery train.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from api_schemas.jobs import JobStatus
from api_schemas.tasks import TrainTask
from core.celery_config import TRAIN_QUEUE, broker_dirs, send
from core.storage import JobPaths, atomic_write_json, flock
from core.store import JobNotFound, JobStore

log = logging.getLogger(__name__)
TRAIN_LOCK = ".train.lock"
DELIVERY_FILE = ".delivery.json"
LEASE_FILE = ".lease"
REAPER_LOCK = ".reaper.lock"


# -- deliveries ------------------------------------------------------------------------------
def open_delivery(paths: JobPaths) -> int:
    """Count this delivery (caller holds the train lock); returns the worker losses so far."""
    f = paths.root / DELIVERY_FILE
    try:
        state = json.loads(f.read_text())
    except (FileNotFoundError, ValueError):
        state = {"deliveries": 0, "losses": 0, "open": False}
    if state.get("open"):
        state["losses"] = int(state.get("losses", 0)) + 1
    state["deliveries"] = int(state.get("deliveries", 0)) + 1
    state["open"] = True
    atomic_write_json(f, state)
    return state["losses"]


def close_delivery(paths: JobPaths) -> None:
    f = paths.root / DELIVERY_FILE
    try:
        state = json.loads(f.read_text())
        state["open"] = False
        atomic_write_json(f, state)
    except (OSError, ValueError):
        log.warning("could not close the delivery record of %s", paths.root.name, exc_info=True)


# -- lease -----------------------------------------------------------------------------------
@contextmanager
def lease(paths: JobPaths, ttl_s: float) -> Iterator[None]:
    """Renew `<job>/.lease` (its mtime) while the body runs. utime needs no free disk blocks."""
    f = paths.root / LEASE_FILE
    stop = threading.Event()

    def renew() -> None:
        while True:
            try:
                f.touch()
            except OSError:
                log.debug("lease renewal failed", exc_info=True)
            if stop.wait(ttl_s / 4):
                return

    thread = threading.Thread(target=renew, name=f"lease-{paths.root.name[:8]}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def lease_age(paths: JobPaths) -> float | None:
    try:
        return time.time() - (paths.root / LEASE_FILE).stat().st_mtime
    except FileNotFoundError:
        return None


def lock_free(paths: JobPaths) -> bool:
    try:
        with open(paths.root / TRAIN_LOCK, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
    except BlockingIOError:
        return False


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
    """Task ids of train messages waiting in (or taken but unacked from) the broker; None when
    that cannot be told, in which case nothing is re-sent on its account."""
    try:
        if settings.redis_url:
            import redis

            r = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
            raws: list = []
            # kombu's priority lists: "train", "train\x06\x163", ...
            for name in r.scan_iter(match=TRAIN_QUEUE + "*", count=100):
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


# -- the reaper ------------------------------------------------------------------------------
def _newest_mtime(root: Path) -> float:
    newest = root.stat().st_mtime
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                newest = max(newest, os.stat(os.path.join(dirpath, name)).st_mtime)
            except FileNotFoundError:
                pass
    return newest


def remove_stale_uploads(store: JobStore, stale_s: float) -> list[str]:
    """Job folders without job.json (an upload that never finished: the API died mid-way)
    untouched for stale_s."""
    removed = []
    jobs_dir = store.storage.jobs_dir
    if not jobs_dir.is_dir():
        return removed
    now = time.time()
    for entry in os.scandir(jobs_dir):
        root = Path(entry.path)
        if not entry.is_dir() or (root / "job.json").exists():
            continue
        try:
            if now - _newest_mtime(root) < stale_s:
                continue
        except FileNotFoundError:
            continue
        if not (root / "job.json").exists():
            shutil.rmtree(root, ignore_errors=True)
            removed.append(entry.name)
    if removed:
        log.warning("removed %d abandoned upload folder(s): %s", len(removed), ", ".join(removed))
    return removed


def stranded_jobs(store: JobStore, settings) -> list[str]:
    """`running` jobs nobody trains (lease stale, lock free), and `queued` jobs older than
    QUEUED_GRACE_S that the broker does not hold."""
    in_broker: set[str] | None = None
    out = []
    now = time.time()
    for job_id in store.storage.job_ids():
        try:
            job = store.get(job_id)
            paths = store.storage.paths(job_id)
            if job.status == JobStatus.running:
                age = lease_age(paths)
                if age is None:
                    age = now - job.updated_at.timestamp()
                if age > settings.lease_ttl_s and lock_free(paths):
                    out.append(job_id)
            elif job.status == JobStatus.queued:
                if now - job.updated_at.timestamp() < settings.queued_grace_s:
                    continue
                if in_broker is None:
                    in_broker = broker_task_ids(settings)
                    if in_broker is None:
                        continue
                if job_id not in in_broker and lock_free(paths):
                    out.append(job_id)
        except (JobNotFound, ValueError, OSError):
            continue
    return out


def reap(app, store: JobStore, settings) -> list[str]:
    sent = stranded_jobs(store, settings)
    for job_id in sent:
        send(app, TrainTask(job_id=job_id), TRAIN_QUEUE, task_id=job_id, ignore_result=True)
    if sent:
        log.warning("reaper re-sent %d stranded training(s): %s", len(sent), ", ".join(sent))
    remove_stale_uploads(store, settings.stale_upload_s)
    return sent


@contextmanager
def _one_reaper(store: JobStore) -> Iterator[bool]:
    """Only one worker reaps at a time (the others skip this round)."""
    store.storage.ensure()
    with flock(store.storage.data_dir / REAPER_LOCK, blocking=False) as mine:
        yield mine


def start_reaper(app, store_factory, settings) -> threading.Thread:
    def loop() -> None:
        while True:
            time.sleep(settings.reaper_interval_s)
            try:
                store = store_factory()
                with _one_reaper(store) as mine:
                    if mine:
                        reap(app, store, settings)
            except Exception:
                log.exception("reaper round failed")

    thread = threading.Thread(target=loop, name="nf-reaper", daemon=True)
    thread.start()
    return thread
