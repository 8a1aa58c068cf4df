"""A worker whose lease another host took writes nothing more (issue 37), on a real PostgreSQL:
host A is a process running the real `nf.train` / `nf.export` task with a stand-in for the
kind's work that, like an evaluation or an artifact upload, never looks at the lease; host B
(this process) takes the lease once A's expiry is past (as it would after A's renewals stalled
for a TTL) and holds it. A's work then ends and writes its outcome: the job stays B's (`running`,
no metrics of A's), the export stays as B found it, and A says its lease was lost."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from sqlalchemy import select, text

from api_schemas.exports import ExportFormat
from api_schemas.jobs import JobStatus, Progress
from core import leases
from core.db.engine import session
from core.db.leases import EXPORT, TRAIN, Lease
from core.exports import ExportStore
from core.settings import Settings
from core.storage import LocalStorage
from core.store import JobStore
from tests.support.databases import database

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

HOST_A = """
import sys, time
from sqlalchemy import select
from core.db.engine import session
from core.db.leases import Lease
import worker.tasks as tasks
import worker.exports as exports

mode, job_id, subject = sys.argv[1], sys.argv[2], sys.argv[3]


def until_taken_over(kind):
    # The work goes on, checking nothing, until another host holds the lease.
    with session() as s:
        mine = s.scalar(select(Lease.holder).where(Lease.kind == kind, Lease.subject == subject))
    print("working", flush=True)
    end = time.time() + 60
    while time.time() < end:
        with session() as s:
            now = s.scalar(select(Lease.holder).where(Lease.kind == kind, Lease.subject == subject))
        if now is not None and now != mine:
            return
        time.sleep(0.1)
    raise SystemExit("never taken over")


if mode == "train":
    def train(ctx):
        until_taken_over("train")
        return {"psnr": 99.0}

    tasks.kind_function = lambda kind, name: train if name == "train" else None
    tasks.train(job_id)
else:
    def maker(job, checkpoint, paths, fmt, options):
        until_taken_over("export")
        return b"ply", {"points": 1}

    exports.MAKERS["image"] = maker
    tasks._checkpoint = lambda job_id, paths, storage: None
    tasks.export(job_id, subject.split("/")[1])
print("returned", flush=True)
"""


@pytest.fixture
def host(tmp_path):
    with database("postgresql", tmp_path) as url:
        data = tmp_path / "data"
        settings = Settings(data_dir=data, database_url=url, lease_ttl_s=60)
        yield settings, JobStore(LocalStorage(data), url=url)


def _run_host_a(settings: Settings, mode: str, job_id: str, subject: str, kind: str):
    env = {
        **os.environ,
        "DATA_DIR": str(settings.data_dir),
        "DATABASE_URL": settings.database_url,
        "LEASE_TTL_S": "60",  # renewed every 15 s: not within this test
        "TORCH_THREADS": "1",
    }
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOST_A, mode, job_id, subject],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.strip() == "working":
            break
    else:
        proc.wait(30)
        pytest.fail("host A never started working:\n" + "".join(lines))
    # A's renewals stalled past its expiry (the database's clock): B's claim takes the lease.
    with session(settings) as s:
        s.execute(
            text(
                "UPDATE leases SET expires_at = now() - interval '1 second' "
                "WHERE kind = :k AND subject = :s"
            ),
            {"k": kind, "s": subject},
        )
    b = leases.claim(settings, kind, subject, 60, job_id=job_id, holder="host-b/boot/ns:7:bbbb")
    assert b is not None, "host B could not take the expired lease"
    out, _ = proc.communicate(timeout=120)
    lines.append(out)
    assert proc.returncode == 0, "".join(lines)
    return b, "".join(lines)


def _holder(settings: Settings, kind: str, subject: str) -> str | None:
    with session(settings) as s:
        return s.scalar(select(Lease.holder).where(Lease.kind == kind, Lease.subject == subject))


def test_a_training_whose_lease_was_taken_writes_no_outcome(host):
    settings, store = host
    job_id = str(uuid.uuid4())
    store.create(job_id, "image", {}, {}, owner="k-fenced")
    b, log = _run_host_a(settings, "train", job_id, job_id, TRAIN)
    store.set_progress(job_id, Progress(step=3, total_steps=10))  # B at work
    job = store.get(job_id)
    assert job.status == JobStatus.running, (job.status, job.metrics, log[-3000:])
    assert job.metrics == {} and job.progress.step == 3
    assert "lease was lost" in log, log[-3000:]
    assert _holder(settings, TRAIN, job_id) == b.holder  # A's release left B's lease alone


def test_an_export_whose_lease_was_taken_writes_no_outcome(host):
    settings, store = host
    job_id = str(uuid.uuid4())
    store.create(job_id, "image", {}, {}, owner="k-fenced")
    exports = ExportStore(store.storage, settings=settings)
    export, _ = exports.create_or_get(job_id, ExportFormat.ply, {})
    subject = f"{job_id}/{export.id}"
    b, log = _run_host_a(settings, "export", job_id, subject, EXPORT)
    seen = exports.get(job_id, export.id)
    assert seen.status.value == "running", (seen, log[-3000:])
    assert seen.artifact is None and seen.stats == {}
    assert "lease was lost" in log, log[-3000:]
    assert _holder(settings, EXPORT, subject) == b.holder
