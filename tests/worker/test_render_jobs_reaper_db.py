"""Render jobs in the reaper's rounds and under the delivery cap, on SQLite and PostgreSQL with
Redis as the broker: a queued render job whose message the broker lost is sent again from the
request kept in its row, one still in the broker is not; a render job (path or frame) whose
worker process is SIGKILLed each time is sent again after each death and fails at
MAX_WORKER_LOSSES."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from api_schemas.jobs import JobStatus
from api_schemas.render import RenderRequest
from api_schemas.tasks import RenderFrameJobTask, RenderPathJobTask
from core import path_jobs
from core.celery_config import RENDER_QUEUE, send
from tests.support.fork_pool import deliver, start_pool
from tests.worker.test_reaper_db import PATH, _job, env  # noqa: F401  (env: fixture)
from worker import reaper

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

FRAME = RenderRequest(width=8, height=8, mode="job")


def _queued(settings, job_id: str, kind: str) -> str:
    render_id = path_jobs.new_id()
    request = (PATH if kind == "path" else FRAME).model_dump(mode="json")
    path_jobs.create(
        job_id, render_id, job_id, "webp" if kind == "path" else "png", 4 if kind == "path" else 1,
        kind=kind, request=request, settings=settings,
    )  # fmt: skip
    return render_id


def test_a_queued_render_job_lost_by_the_broker_is_sent_again(env):  # noqa: F811
    settings, store, client = env
    job_id = _job(store)
    store.set_status(job_id, JobStatus.succeeded)
    waiting = _queued(settings, job_id, "path")
    lost_path = _queued(settings, job_id, "path")
    lost_frame = _queued(settings, job_id, "frame")
    request = path_jobs.request_of(job_id, waiting, settings=settings)
    task = RenderPathJobTask(job_id=job_id, render_id=waiting, request=request)
    send(client, task, RENDER_QUEUE, ignore_result=True)

    found = {
        (r.task.name, r.task.render_id, r.queue, r.why)
        for r in reaper.stranded(settings)
        if hasattr(r.task, "render_id")
    }
    assert found == {
        (RenderPathJobTask.name, lost_path, RENDER_QUEUE, "lost message"),
        (RenderFrameJobTask.name, lost_frame, RENDER_QUEUE, "lost message"),
    }
    # Sent from the request kept in the row, and not again within a lease TTL.
    assert reaper.stranded_renders(settings, reaper.broker_task_ids(settings)) == []
    assert path_jobs.read(job_id, waiting, settings=settings)["status"] == "queued"


# A prefork pool in small: the worker modules are imported once, and each delivery runs in a
# process forked from this one (as Celery's pool processes are), whose end is reported back as
# `<kind> <exit code>` (a negative code: the signal that ended it). Each delivery that starts a
# Python of its own pays the imports (torch) again: seconds each, eight times over.
RENDER_WORKER = """
import os, signal, sys, traceback
from core import path_jobs
from worker import render_jobs

def dies(job_id, render_id, request, *_):  # the render takes its process down (OOM, a crash)
    path_jobs.update(job_id, render_id, status="running")  # as its start does
    os.kill(os.getpid(), signal.SIGKILL)

render_jobs._render_path_job = render_jobs._render_frame_job = dies
for line in sys.stdin:
    job_id, render_id, kind = line.split()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            task = render_jobs.render_path_job if kind == "path" else render_jobs.render_frame_job
            task(job_id, render_id, path_jobs.request_of(job_id, render_id))
            code = 0  # returned
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(kind, os.waitstatus_to_exitcode(status), flush=True)
"""


def _deliver(pool: subprocess.Popen, log: Path, job_id: str, render_id: str, kind: str) -> int:
    """One delivery of the render job in a fresh pool process; its exit code."""
    got_kind, code = deliver(pool, log, f"{job_id} {render_id} {kind}").split()
    assert got_kind == kind, (got_kind, code)
    return int(code)


def test_a_render_job_that_kills_its_worker_is_sent_again_then_fails_at_the_cap(env, tmp_path):  # noqa: F811
    settings, store, _ = env
    # The pool's start (its imports) and the deliveries outlast the fixture's MAX_RENDER_JOB_S.
    settings = settings.model_copy(update={"max_render_job_s": 600.0})
    job_id = _job(store)
    store.set_status(job_id, JobStatus.succeeded)
    renders = {kind: _queued(settings, job_id, kind) for kind in ("path", "frame")}
    log = tmp_path / "pool.log"
    pool = start_pool(RENDER_WORKER, settings, log, without=("REDIS_URL",))
    try:
        for delivery in range(1, 5):
            codes = {
                kind: _deliver(pool, log, job_id, render_id, kind)
                for kind, render_id in renders.items()
            }
            for kind, code in codes.items():
                state = path_jobs.read(job_id, renders[kind], settings=settings)
                if delivery <= 3:
                    assert code == -signal.SIGKILL, log.read_text()[-2000:]
                    assert state["status"] == "running"
                else:
                    assert code == 0, log.read_text()[-2000:]  # the task returned
                    assert state["status"] == "failed"
                    assert "worker lost 3 times" in state["error"]
                    assert "MAX_WORKER_LOSSES" in state["error"]
            if delivery <= 3:
                # Its worker is gone: once the lease has run out, the next round sends it again.
                time.sleep(settings.lease_ttl_s + 0.3)
                again = reaper.stranded_renders(settings, in_broker=set())
                assert {(r.task.render_id, r.why) for r in again} == {
                    (renders["path"], "lost worker"),
                    (renders["frame"], "lost worker"),
                }
    finally:
        pool.stdin.close()
        pool.wait(30)
    assert reaper.stranded_renders(settings, in_broker=set()) == []
