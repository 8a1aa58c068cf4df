"""The reaper's rounds (worker/reaper.py) on SQLite and PostgreSQL, with the broker a real
Redis: a queued job whose message is lost is sent again, once; a scene job waiting in the
preprocess queue is left alone (and, lost, goes back to preprocess, not train); a running job
whose train lease ran out is sent again, one whose holder renews is not; exports and render
jobs get the same coverage (a render job whose worker is gone is sent again from its kept
request); a render job past MAX_RENDER_JOB_S fails; candidates come from the
unfinished rows only."""

from __future__ import annotations

import signal
import time
import uuid

import pytest
from celery import Celery

from api_schemas.exports import ExportFormat, ExportStatus
from api_schemas.jobs import JobStatus
from api_schemas.render import Orbit, PathRequest
from api_schemas.tasks import PreprocessTask, TrainTask
from core import leases, path_jobs
from core.celery_config import PREPROCESS_QUEUE, TRAIN_QUEUE, celery_config, send
from core.db.leases import TRAIN
from core.exports import ExportStore
from core.settings import Settings
from core.storage import LocalStorage
from core.store import JobStore
from tests.support.databases import KINDS, database
from tests.support.fork_pool import deliver, start_pool
from tests.support.stack import redis_url_or_skip
from worker import reaper

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

ELSEWHERE = "other-host/boot/ns:4242:abc"
PATH = PathRequest(orbit=Orbit(radius=2.0, n_frames=4), width=8, height=8)


@pytest.fixture(params=KINDS)
def env(request, tmp_path):
    redis_url = redis_url_or_skip(14)
    with database(request.param, tmp_path) as url:
        settings = Settings(
            data_dir=tmp_path,
            database_url=url,
            redis_url=redis_url,
            lease_ttl_s=1.0,
            queued_grace_s=0.0,
            max_render_job_s=2.0,
        )
        client = Celery("test-reaper")
        client.conf.update(celery_config(settings))
        store = JobStore(LocalStorage(tmp_path), url=url)
        yield settings, store, client


def _job(store: JobStore, dataset: dict | None = None, kind: str = "image") -> str:
    job_id = str(uuid.uuid4())
    store.reserve(job_id, "k-owner")
    store.create(job_id, kind, {}, dataset or {}, owner="k-owner")
    return job_id


def _sent(found) -> dict[str, tuple[str, str]]:
    return {r.task.job_id: (r.task.name, r.queue) for r in found}


def test_lost_queued_jobs_are_sent_to_their_stage_once(env):
    settings, store, client = env
    waiting_sfm = _job(store, {"sfm": "pending"})
    waiting_train = _job(store)
    lost_train = _job(store)
    lost_sfm = _job(store, {"sfm": "pending"})
    finished = _job(store)
    store.set_status(finished, JobStatus.succeeded)
    send(client, PreprocessTask(job_id=waiting_sfm), PREPROCESS_QUEUE, ignore_result=True)
    send(client, TrainTask(job_id=waiting_train), TRAIN_QUEUE, ignore_result=True)
    in_broker = reaper.broker_task_ids(settings)
    assert {waiting_sfm, waiting_train} <= in_broker

    found = _sent(reaper.stranded(settings))
    assert found == {
        lost_train: (TrainTask.name, TRAIN_QUEUE),
        lost_sfm: (PreprocessTask.name, PREPROCESS_QUEUE),
    }
    assert reaper.stranded(settings) == []  # re-sent: not again within a lease TTL


def test_running_jobs_are_sent_again_when_their_lease_runs_out(env):
    settings, store, _ = env
    dead, alive = _job(store), _job(store)
    for job_id in (dead, alive):
        store.set_status(job_id, JobStatus.running)
    gone = leases.claim(settings, TRAIN, dead, 0.5, job_id=dead, holder=ELSEWHERE)
    assert gone is not None
    with leases.held(settings, TRAIN, alive, 0.5, job_id=alive):
        assert reaper.stranded(settings) == []  # both leases still live
        time.sleep(0.8)
        assert _sent(reaper.stranded(settings)) == {dead: (TrainTask.name, TRAIN_QUEUE)}
    # The re-sent delivery counts the worker its predecessor lost.
    again = leases.claim(settings, TRAIN, dead, 30, job_id=dead)
    assert again is not None and again.losses == 1


def test_exports_and_render_jobs_are_covered(env):
    settings, store, _ = env
    job_id = _job(store)
    store.set_status(job_id, JobStatus.succeeded)
    exports = ExportStore(None, settings)
    lost_msg, _ = exports.create_or_get(job_id, ExportFormat.splat, {})
    lost_worker, _ = exports.create_or_get(job_id, ExportFormat.ply, {})
    exports.update(job_id, lost_worker.id, status=ExportStatus.running)
    leases.claim(
        settings, "export", f"{job_id}/{lost_worker.id}", 0.3, job_id=job_id, holder=ELSEWHERE
    )
    slow = path_jobs.new_id()
    path_jobs.create(
        job_id, slow, job_id, "webp", 4, request=PATH.model_dump(mode="json"), settings=settings
    )
    path_jobs.update(job_id, slow, settings=settings, status="running")
    orphan = path_jobs.new_id()
    path_jobs.create(
        job_id, orphan, job_id, "webp", 4, request=PATH.model_dump(mode="json"), settings=settings
    )
    path_jobs.update(job_id, orphan, settings=settings, status="running")
    leases.claim(settings, "render", orphan, 0.3, job_id=job_id, holder=ELSEWHERE)
    unrecoverable = path_jobs.new_id()
    path_jobs.create(job_id, unrecoverable, job_id, "webp", 4, settings=settings)
    time.sleep(0.5)

    found = {
        (r.task.name, getattr(r.task, "export_id", None) or getattr(r.task, "render_id", None))
        for r in reaper.stranded(settings)
    }
    assert found == {
        ("nf.export", lost_msg.id),
        ("nf.export", lost_worker.id),
        ("nf.render_path_job", orphan),
    }
    assert path_jobs.read(job_id, unrecoverable, settings=settings)["status"] == "failed"
    time.sleep(3.0)  # past MAX_RENDER_JOB_S + the lease TTL
    reaper.stranded(settings)
    state = path_jobs.read(job_id, slow, settings=settings)
    assert state["status"] == "failed" and "MAX_RENDER_JOB_S" in state["error"]


# A prefork pool in small (as tests/worker/test_render_jobs_reaper_db.py's): the modules are
# imported once, each delivery runs in a process forked from this one, as Celery's pool
# processes are, and its end is reported back as its exit code (negative: the signal).
EXPORT_WORKER = """
import contextlib, os, signal, sys, traceback
from core.storage import LocalStorage
from core.store import JobStore
from worker.exports import execute

def dies(*_):  # the export takes its worker down (out of memory, a crash in a kernel)
    os.kill(os.getpid(), signal.SIGKILL)

for line in sys.stdin:
    job_id, export_id = line.split()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            store = JobStore(LocalStorage(os.environ["DATA_DIR"]), url=os.environ["DATABASE_URL"])
            execute(store, job_id, export_id, dies, lambda storage, job_id: contextlib.nullcontext())
            code = 0  # returned
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


def test_an_export_that_kills_its_worker_is_sent_again_then_fails_at_the_cap(env, tmp_path):
    settings, store, _ = env
    job_id = _job(store, kind="splat")
    store.set_status(job_id, JobStatus.succeeded)
    exports = ExportStore(None, settings)
    export, _ = exports.create_or_get(job_id, ExportFormat.splat, {})
    log = tmp_path / "pool.log"
    pool = start_pool(EXPORT_WORKER, settings, log)
    try:
        for delivery in range(1, 5):
            code = int(deliver(pool, log, f"{job_id} {export.id}"))
            state = exports.get(job_id, export.id)
            if delivery <= 3:
                assert code == -signal.SIGKILL, log.read_text()[-2000:]
                assert state.status == ExportStatus.running
                # Its worker is gone: once its lease has run out, the next round sends it again
                # (here: once per death). Rounds judge leases by expiry alone, whatever the host.
                time.sleep(settings.lease_ttl_s + 0.3)
                (again,) = reaper.stranded_exports(settings, in_broker=set())
                assert again.task.export_id == export.id and again.why == "lost worker"
            else:
                assert code == 0, log.read_text()[-2000:]  # the export returned
    finally:
        pool.stdin.close()
        pool.wait(30)
    assert state.status == ExportStatus.failed
    assert "worker lost 3 times" in state.error and "MAX_WORKER_LOSSES" in state.error
    assert reaper.stranded_exports(settings, in_broker=set()) == []
