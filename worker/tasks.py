"""Celery tasks: nf.preprocess, nf.train, nf.render, nf.render_path, nf.export; the render jobs
(nf.render_path_job, nf.render_frame_job) are in worker.render_jobs. Kind-specific work lives in
worker.jobs.<kind>; structure from motion for uploads without poses in worker.sfm."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init, worker_ready, worker_shutting_down
from pydantic import ValidationError

from api_schemas.jobs import JobStatus
from api_schemas.render import PathRequest, RenderRequest
from api_schemas.tasks import (
    ExportTask,
    PreprocessTask,
    RenderPathTask,
    RenderTask,
    TrainTask,
)
from core import leases, metrics, retry, usage, webhooks
from core.celery_config import PREPROCESS_QUEUE, TRAIN_QUEUE, send
from core.db.leases import SFM, TRAIN
from core.process import set_parent_death_signal
from core.scene_format import CAMERAS_FILE
from core.settings import get_settings
from core.storage import Storage, without_paths
from core.storage_factory import get_storage
from core.store import CancelFlag, JobNotFound, JobStore
from core.webhook_sender import start_sender
from worker.app import app, limit_torch_threads
from worker.checkpoints import Checkpoint, CheckpointManager, Published
from worker.jobs import (
    STOP,
    JobCancelled,
    JobContext,
    JobInterrupted,
    LeaseLost,
    RenderError,
    UnknownKind,
    kind_function,
    pick_device,
)
from worker.memory import reuse_freed_memory
from worker.progress import ProgressReporter
from worker.reaper import orphans, remove_stale_uploads, start_reaper
from worker.scratch import is_local, job_work_dir
from worker.sfm import stage as sfm_stage

log = logging.getLogger(__name__)
RENDER_CACHE_SIZE = 4
limit_torch_threads()
reuse_freed_memory()  # inherited by the forked pool processes


def _warm_up() -> None:
    # The first optimiser built in a process pays ~1.5 s of lazy torch imports; pay it once
    # here (before the pool forks) instead of inside every job's first step.
    import torch

    torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1e-3)


_warm_up()


def _store() -> JobStore:
    storage = get_storage(get_settings())
    return JobStore(storage, listeners=[webhooks.status_recorder(storage), metrics.status_listener])


# Renders enter the cache many times a second; its size is measured at most this often.
EVICT_EVERY_S = 5.0


def work_dir(storage: Storage, job_id: str):
    """The job's working copy held for the block (worker.scratch): the job folder itself with
    local storage, a bounded scratch cache entry with object storage."""
    return job_work_dir(storage, job_id, int(get_settings().scratch_max_gb * 2**30), EVICT_EVERY_S)


def published(storage: Storage, job_id: str) -> Published | None:
    """Where the job's checkpoints are uploaded to; None with local storage (the working copy
    is the only copy)."""
    return None if is_local(storage) else Published(storage, job_id)


def _short_error(exc: BaseException) -> str:
    if retry.transient(exc):  # its text names the database's or the storage's host
        return retry.public_text(exc)
    msg = without_paths(str(exc).strip())
    if isinstance(exc, UnknownKind):
        return msg
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _start(store: JobStore, job_id: str):
    """queued -> running unless a cancel got there first. Returns the job, or None to skip."""
    # A cancel after this read finds the job queued (and cancels it itself) or running (and
    # the trainer polls the flag).
    cancel = store.cancel_requested(job_id)

    def change(job):
        if job.status.terminal:
            return None
        if cancel:
            job.status = JobStatus.cancelled
            return job
        job.status = JobStatus.running  # also a redelivered, already running job
        job.error = None
        return job

    # A second `running` event tells stream readers that the training (re)started.
    job = store.update(job_id, change, status_event=True)
    return job if job.status == JobStatus.running else None


# -- training ------------------------------------------------------------------------------
def _train_lease(settings, job_id: str, count: bool):
    """The job's train lease (core/leases.py), renewed while held: one delivery trains (or runs
    the SfM stage of) a job at a time, on any host. A second delivery of the same job (a
    redelivered or re-sent message) finds it held and leaves the job to its holder. Yields the
    claim (with the worker losses so far), or None."""
    return leases.held(
        settings,
        TRAIN,
        job_id,
        settings.lease_ttl_s,
        job_id=job_id,
        count=count,
        wait_s=5.0,
        give_up=STOP.is_set,
    )


@app.task(
    name=TrainTask.name,
    ignore_result=True,
    acks_late=True,
    # The training budget ceiling: SoftTimeLimitExceeded is raised inside the trainer.
    soft_time_limit=get_settings().max_train_s,
)
def train(job_id: str) -> None:
    job_id = TrainTask(job_id=job_id).job_id
    settings = get_settings()
    store = _store()
    try:
        store.get(job_id)
    except (JobNotFound, ValueError):
        log.warning("nf.train: job %s does not exist (deleted?)", job_id)
        return
    with (
        _stops_on_sigterm(),
        _train_lease(settings, job_id, count=True) as mine,
        _stops_when_lost(job_id) as lost,
    ):
        if mine is None:
            log.warning(
                "nf.train: job %s is being trained by another process; dropping this delivery",
                job_id,
            )
            return
        # Every job write of this delivery checks, in its transaction, that it still holds the
        # lease: once another worker has it, nothing more is written (LeaseLost, ending the block).
        store = store.fenced(mine)
        if sfm_stage.needs_preprocess(store.storage, job_id):  # an orphan waiting for its SfM
            _send(PreprocessTask(job_id=job_id), PREPROCESS_QUEUE)
            return
        losses = mine.losses
        if losses >= settings.max_worker_losses:
            _fail_when_possible(
                store,
                job_id,
                f"worker lost {losses} times (MAX_WORKER_LOSSES={settings.max_worker_losses}):"
                " the training process died each time (out of memory? a crash?)",
            )
            return
        with work_dir(store.storage, job_id) as work:
            _train_locked(store, settings, job_id, work, mine)
    if not lost:
        usage.refresh(settings, store.storage, job_id)  # its checkpoints and artifacts


@contextmanager
def _stops_when_lost(job_id: str) -> Iterator[list]:
    """Ends the block at a LeaseLost (a fenced write refused, or the lease found lost): the job
    is its new holder's. The yielded list is non-empty once that happened."""
    lost: list = []
    try:
        yield lost
    except LeaseLost:
        lost.append(True)
        log.error("job %s: its train lease was lost; stopped, leaving the job as it is", job_id)


def _send(task: TrainTask | PreprocessTask, queue: str) -> None:
    # task id == job id: cancelling a queued job revokes whichever of its tasks is waiting.
    send(app, task, queue, task_id=task.job_id, ignore_result=True)


@app.task(name=PreprocessTask.name, ignore_result=True, acks_late=True)
def preprocess(job_id: str) -> None:
    """Structure from motion on an upload without poses, then the job goes to the train queue.
    Holds the train lease, so a job is never preprocessed and trained at once."""
    job_id = PreprocessTask(job_id=job_id).job_id
    settings = get_settings()
    store = _store()
    try:
        job = store.get(job_id)
    except (JobNotFound, ValueError):
        log.warning("nf.preprocess: job %s does not exist (deleted?)", job_id)
        return
    with _train_lease(settings, job_id, count=False) as mine, _stops_when_lost(job_id) as lost:
        if mine is None:
            log.warning("nf.preprocess: job %s is held by another process", job_id)
            return
        store = store.fenced(mine)  # as in nf.train: no write once another holder has it
        if sfm_stage.needs_preprocess(store.storage, job_id):
            job = _start(store, job_id)
            if job is None:
                return
            try:
                progress = ProgressReporter(
                    store, job_id, settings.progress_interval_s, stage="sfm"
                )
                with (
                    progress,
                    metrics.stage_timer(job.kind.value, "sfm"),
                    work_dir(store.storage, job_id) as work,
                    # Counts this run as a delivery of the capture's SfM: one that ends with
                    # its worker dead is a loss the next run sees, on any host.
                    leases.held(
                        settings, SFM, job_id, settings.lease_ttl_s, job_id=job_id
                    ) as delivery,
                ):
                    store.storage.pull(job_id, f"{sfm_stage.CAPTURE_DIR}/")
                    cancelled = CancelFlag(store, job_id)
                    summary = sfm_stage.run(
                        job,
                        work,
                        settings,
                        progress,
                        # a lost lease stops the stage as a cancel does (pycolmap watches it)
                        lambda: mine.lost.is_set() or cancelled(),
                        deaths=delivery.losses if delivery is not None else 0,
                    )
                    if mine.lost.is_set():  # no dataset published by a holder that lost it
                        raise LeaseLost(f"the train lease of {job_id} was lost")
                    sfm_stage.publish(store.storage, job_id)
            except sfm_stage.SfmCancelled:
                if mine.lost.is_set():
                    raise LeaseLost(f"the train lease of {job_id} was lost") from None
                store.set_status(
                    job_id, JobStatus.cancelled, only_from={JobStatus.running, JobStatus.queued}
                )
                return
            except LeaseLost:
                raise
            except Exception as exc:
                if not isinstance(exc, sfm_stage.StageError):
                    log.error("job %s: SfM failed:\n%s", job_id, traceback.format_exc())
                if retry.transient(exc):  # sent to `preprocess` again by the reaper
                    _hand_back(store, job_id, exc)
                    return
                store.set_status(
                    job_id,
                    JobStatus.failed,
                    error=without_paths(str(exc))
                    if isinstance(exc, sfm_stage.StageError)
                    else _short_error(exc),
                    only_from={JobStatus.running, JobStatus.queued},
                )
                return

            def merge(j):
                j.dataset.update(summary)
                return j

            store.update(job_id, merge)
            usage.refresh(settings, store.storage, job_id)  # its dataset
        elif job.status.terminal:
            return
    if not lost:
        _send(TrainTask(job_id=job_id), TRAIN_QUEUE)


def _train_locked(store: JobStore, settings, job_id: str, paths, lease) -> None:
    """Train the job in its working copy `paths`: the dataset and the latest published
    checkpoint pulled first, each checkpoint published as it is saved, artifacts at the end.
    `lease`: the train lease's claim, whose loss stops the training."""
    try:
        job = _start(store, job_id)
    except (JobNotFound, ValueError):
        log.warning("nf.train: job %s does not exist (deleted?)", job_id)
        return
    if job is None:
        return
    storage = store.storage
    try:
        train_fn = kind_function(job.kind.value, "train")
        started = time.time()
        remote = published(storage, job_id)
        storage.pull(job_id, "dataset/")
        if remote is not None:
            remote.pull_latest(paths.checkpoints)
        ctx = JobContext(
            job=job,
            paths=paths,
            settings=settings,
            store=store,
            progress=ProgressReporter(store, job_id, settings.progress_interval_s, stage="train"),
            checkpoints=CheckpointManager(
                paths.checkpoints,
                keep=settings.checkpoints_kept,
                interval_s=settings.checkpoint_interval_s,
                published=remote,
                # the pointer to a new checkpoint is written only while the lease is ours
                confirm=lambda: store.confirm(job_id),
            ),
            device=pick_device(settings.device),
            lease=lease,
        )
        with ctx.progress, metrics.stage_timer(job.kind.value, "train"):
            final = train_fn(ctx) or {}
        _push_made_since(storage, job_id, paths.artifacts, started)
    except JobCancelled:
        store.set_status(
            job_id, JobStatus.cancelled, only_from={JobStatus.running, JobStatus.queued}
        )
        log.info("job %s cancelled", job_id)
        return
    except LeaseLost:
        # Another worker may hold the job now: its state is that worker's to write.
        log.error("job %s: its train lease was lost; stopped, leaving the job as it is", job_id)
        return
    except JobInterrupted:
        # The worker is shutting down: hand the job back; the next worker (or this one,
        # restarted) resumes it from its latest checkpoint.
        store.set_status(job_id, JobStatus.queued, only_from={JobStatus.running})
        log.warning("job %s interrupted by worker shutdown; back in the queue", job_id)
        return
    except SoftTimeLimitExceeded:
        _fail_when_possible(
            store,
            job_id,
            f"training ran past its time ceiling of {settings.max_train_s:g} s (MAX_TRAIN_S)",
        )
        return
    except Exception as exc:
        log.error("job %s failed:\n%s", job_id, traceback.format_exc())
        if retry.transient(exc):
            _hand_back(store, job_id, exc)
            return
        _fail_when_possible(store, job_id, _short_error(exc))
        return
    store.set_status(job_id, JobStatus.succeeded, metrics=final, only_from={JobStatus.running})


def _hand_back(store: JobStore, job_id: str, exc: BaseException) -> None:
    """The database or storage failed past the retries (not the job's fault): the job goes back
    to `queued` instead of failing, and the reaper sends it again after QUEUED_GRACE_S (it
    resumes from its latest checkpoint; this delivery ended cleanly, so no worker is lost)."""
    log.warning("job %s: %s; back in the queue", job_id, retry.public_text(exc))
    store.set_status(job_id, JobStatus.queued, only_from={JobStatus.running})


def _push_made_since(storage: Storage, job_id: str, folder, since: float) -> None:
    """Store the files of the work dir's `folder` that were written since `since` (what this
    training made, not a render job's older output), leaving out temporary dot-files."""
    if is_local(storage) or not folder.is_dir():
        return
    for path in sorted(folder.rglob("*")):
        # a second of slack: file times can trail the clock by a tick
        if path.is_file() and not path.name.startswith(".") and path.stat().st_mtime >= since - 1:
            storage.push(job_id, path.relative_to(folder.parent).as_posix())


def _fail_when_possible(store: JobStore, job_id: str, error: str, max_wait_s: float = 3600) -> None:
    """Mark the job failed. On a full disk that write fails too (SQLite cannot grow its file, and
    the error surfaces as ENOSPC): keep trying, with the lease still renewed, until space is back, so the job does
    not stay `running` with nobody training it."""
    delay, waited = 0.5, 0.0
    while True:
        try:
            store.set_status(
                job_id,
                JobStatus.failed,
                error=error,
                only_from={JobStatus.running, JobStatus.queued},
            )
            return
        except JobNotFound:
            return
        except OSError as exc:
            if waited >= max_wait_s:
                raise
            log.warning("job %s: cannot record its failure yet (%s); retrying", job_id, exc)
            time.sleep(delay)
            waited += delay
            delay = min(delay * 2, 10.0)


# -- shutdown --------------------------------------------------------------------------------
# Celery's warm shutdown waits for running tasks, which for a training means hours. The worker's
# main process passes SIGTERM on to its pool processes; one that is training stops at its next
# step (JobInterrupted: the job goes back to the queue and resumes from its checkpoint), an idle
# one exits as it would have.
@contextmanager
def _stops_on_sigterm() -> Iterator[None]:
    """While training, SIGTERM asks the trainer to stop (billiard's own handler, which exits the
    process at once, is back in place afterwards)."""
    STOP.clear()
    try:
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: STOP.set())
    except ValueError:  # not the main thread (a threads pool): no signal to catch here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@worker_process_init.connect
def _pool_process_dies_with_its_worker(**_):
    # Celery asks for SIGKILL when the worker's main process dies; SIGTERM lets a training in
    # progress hand its job back first.
    set_parent_death_signal(signal.SIGTERM)


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # ppid is the second field after the parenthesised command name.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry))
    return out


@worker_shutting_down.connect
def _stop_trainings(sig=None, how=None, **_):
    if how != "Warm":
        return
    for pid in _children(os.getpid()):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


# -- orphaned trainings ---------------------------------------------------------------------
def requeue_orphans() -> list[str]:
    """`running` jobs that nobody trains (the whole worker was killed, so the broker never saw
    the task fail): send them again; they resume from their latest checkpoint. `queued` jobs
    nobody holds are sent again too, in case the broker lost their message (the filesystem
    broker loses a taken one; Redis would hold it back for the visibility timeout). Sending one
    twice is harmless: the train lease lets only one delivery train."""
    found = orphans(get_settings())
    try:
        remove_stale_uploads(_store(), get_settings().stale_upload_s)
    except Exception:
        log.warning("could not look for abandoned upload folders", exc_info=True)
    for r in found:
        _send(r.task, r.queue)
    sent = [r.task.job_id for r in found if r.why == JobStatus.running.value]
    queued = [r.task.job_id for r in found if r.why != JobStatus.running.value]
    if sent:
        log.warning("requeued %d orphaned training(s): %s", len(sent), ", ".join(sent))
    if queued:
        log.warning(
            "re-sent %d queued training(s) from the job store: %s", len(queued), ", ".join(queued)
        )
    return sent + queued


@worker_ready.connect
def _on_worker_ready(sender=None, **_):
    queues = (
        {q.name for q in sender.app.amqp.queues.consume_from.values()}
        if sender is not None
        else set()
    )
    if TRAIN_QUEUE in queues or not queues:
        try:
            requeue_orphans()
        except Exception:
            log.exception("could not check for orphaned trainings")
        start_reaper(app, _store, get_settings())
        start_sender(get_storage(get_settings()), get_settings())


# -- rendering -----------------------------------------------------------------------------
_cache: OrderedDict[tuple[str, int], Checkpoint] = OrderedDict()
_cache_lock = threading.Lock()


def _checkpoint(job_id: str, paths, storage: Storage) -> Checkpoint:
    """The job's newest checkpoint (the published one with object storage, downloaded into the
    working copy `paths`, which the caller holds), from a small per-process LRU."""
    mgr = CheckpointManager(paths.checkpoints)
    remote = published(storage, job_id)
    step = mgr.latest_step() if remote is None else remote.latest_step()
    with _cache_lock:
        if step is not None and (job_id, step) in _cache:
            _cache.move_to_end((job_id, step))
            return _cache[(job_id, step)]
    if remote is not None and step is not None:
        remote.pull_latest(paths.checkpoints, step)
        # renders in nerfstudio's frame resolve against every dataset camera (worker/scene)
        storage.pull(job_id, f"dataset/{CAMERAS_FILE}")
    ckpt = mgr.load_latest()
    if ckpt is None:
        raise RenderError(409, "the job has no readable checkpoint")
    with _cache_lock:
        _cache[(job_id, ckpt.step)] = ckpt
        while len(_cache) > RENDER_CACHE_SIZE:
            _cache.popitem(last=False)
    return ckpt


# Render results go to storage under this prefix of the job; the API reads one back, serves it and
# deletes it (service/queue.py deletes those whose caller gave up, and job deletion the rest).
RESULTS_PREFIX = "renders/results/"
EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/webp": "webp",
    "image/gif": "gif",
    "video/mp4": "mp4",
    "application/zip": "zip",
}


def _render(
    task, job_id: str, request: RenderRequest | PathRequest, fn_name: str
) -> dict[str, Any] | None:
    """A render's result for the API: the stored object's key, or an error; None when its
    caller has given up (nothing is stored then)."""
    store = _store()
    try:
        job = store.get(job_id)
    except (JobNotFound, ValueError):
        return {"error": {"status_code": 404, "detail": f"job {job_id} not found"}}
    try:
        fn = kind_function(job.kind.value, fn_name)
        if fn is None:
            raise RenderError(
                422, f"{job.kind.value} jobs do not support {fn_name.replace('_', ' ')}"
            )
        with work_dir(store.storage, job_id) as work:
            checkpoint = _checkpoint(job_id, work, store.storage)
        data, content_type = fn(job, checkpoint, request)
    except RenderError as exc:
        return {"error": {"status_code": exc.status_code, "detail": exc.detail}}
    except UnknownKind as exc:
        return {"error": {"status_code": 422, "detail": str(exc)}}
    except NotImplementedError as exc:
        return {
            "error": {
                "status_code": 422,
                "detail": str(exc) or f"{fn_name} is not implemented for {job.kind.value}",
            }
        }
    except SoftTimeLimitExceeded:
        return {"error": {"status_code": 504, "detail": "render hit its time limit"}}
    except Exception as exc:
        log.exception("render of %s failed", job_id)
        # The exception's text stays in this log: it can name server paths and internals.
        detail = f"the render failed on the worker ({type(exc).__name__}; its cause is logged)"
        return {"error": {"status_code": 500, "detail": detail}}
    limit = get_settings().max_render_result_bytes
    if len(data) > limit:
        return {
            "error": {
                "status_code": 413,
                "detail": f"the rendered result ({len(data)} bytes) is over the limit of "
                f"{limit} bytes (MAX_RENDER_RESULT_MB); ask for fewer frames or pixels",
            }
        }
    if _abandoned(task):
        return None
    ext = EXTENSIONS.get(content_type.split(";")[0], "bin")
    key = f"{RESULTS_PREFIX}{task.request.id or uuid.uuid4()}.{ext}"
    try:
        store.storage.put_bytes(job_id, key, data)
    except Exception as exc:
        log.exception("storing the render of %s failed", job_id)
        detail = f"the render could not be stored ({type(exc).__name__}; its cause is logged)"
        return {"error": {"status_code": 500, "detail": detail}}
    return {
        "content_type": content_type,
        "job_id": job_id,
        "key": key,
        "size": len(data),
        "checkpoint_step": checkpoint.step,
    }


def _abandoned(task) -> bool:
    """The API stops waiting at the task's `expires` (RENDER_TIMEOUT_S after sending): a result
    finished later would only sit in storage and the result backend."""
    expires = task.request.expires
    if expires:
        from datetime import datetime

        deadline = datetime.fromisoformat(expires) if isinstance(expires, str) else expires
        if datetime.now(deadline.tzinfo) > deadline:
            log.info("render %s finished after its caller gave up; result dropped", task.request.id)
            return True
    return False


def _unless_abandoned(task, result: dict[str, Any] | None) -> dict[str, Any] | None:
    """An error finished after its caller gave up is dropped too (a stored result was checked
    before it was stored)."""
    if result is None or ("key" not in result and _abandoned(task)):
        return None
    return result


def _invalid(exc: ValidationError) -> dict[str, Any]:
    """A message that does not validate (sent by a newer or broken API): a 422 to its caller."""
    errors = "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False)
    )
    return {"error": {"status_code": 422, "detail": f"invalid render task: {errors}"}}


@app.task(name=RenderTask.name, acks_late=False, bind=True)
def render(self, job_id: str, request: dict[str, Any]) -> dict[str, Any] | None:
    try:
        task = RenderTask.model_validate({"job_id": job_id, "request": request})
    except ValidationError as exc:
        return _invalid(exc)
    return _unless_abandoned(self, _render(self, task.job_id, task.request, "render"))


@app.task(name=RenderPathTask.name, acks_late=False, bind=True)
def render_path(self, job_id: str, request: dict[str, Any]) -> dict[str, Any] | None:
    try:
        task = RenderPathTask.model_validate({"job_id": job_id, "request": request})
    except ValidationError as exc:
        return _invalid(exc)
    return _unless_abandoned(self, _render(self, task.job_id, task.request, "render_path"))


# -- exports -------------------------------------------------------------------------------
@app.task(name=ExportTask.name, ignore_result=True, acks_late=True)
def export(job_id: str, export_id: str) -> None:
    # State is the export's row, run under its lease (core/exports.py), so a redelivery after a
    # crash runs the export again, and one whose workers keep dying fails at MAX_WORKER_LOSSES.
    from worker.exports import execute

    task = ExportTask(job_id=job_id, export_id=export_id)
    store = _store()
    try:
        execute(store, task.job_id, task.export_id, _checkpoint, work_dir)
    except LeaseLost:  # a fenced write refused: the export is its new holder's
        log.error("export %s/%s: its lease was lost; stopped", task.job_id, task.export_id)
        return
    usage.refresh(get_settings(), store.storage, task.job_id)
    webhooks.record_export(store.storage, task.job_id, task.export_id)
