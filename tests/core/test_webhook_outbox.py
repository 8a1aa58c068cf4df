"""A status change and its webhook delivery are written together (issue 37), on SQLite and
PostgreSQL: a process that dies the moment after a status change committed (here: the first thing
it does after the commit, whatever records webhooks then, ends it with exit code 9) leaves the
change and its pending delivery, or neither; and the delivery rows of a job's status changes and
of its export, written by two processes at once, are numbered without a gap or a failure."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from api_schemas.jobs import JobStatus
from api_schemas.webhooks import WebhookEventType
from core import webhooks
from core.storage import LocalStorage
from core.store import JobStore
from tests.support.databases import KINDS, database

DIES_AFTER_COMMIT = """
import os, sys
from core import webhooks
from core.storage import LocalStorage
from core.store import JobStore
from api_schemas.jobs import JobStatus

url, data_dir, job_id = sys.argv[1], sys.argv[2], sys.argv[3]
storage = LocalStorage(data_dir)
# Whatever the process does once the change has committed, it dies doing it (SIGKILL, OOM).
webhooks.record_event = lambda *a, **k: os._exit(9)
store = JobStore(storage, listeners=[webhooks.status_recorder(storage), lambda job: os._exit(9)], url=url)
store.set_status(job_id, JobStatus.running)
os._exit(0)
"""


@pytest.fixture(params=KINDS)
def db(request, tmp_path, monkeypatch):
    """The database's URL and the DATA_DIR whose process settings name it (core/webhooks.py
    finds its tables through them)."""
    from core.settings import get_settings

    with database(request.param, tmp_path) as url:
        if url.startswith("postgresql"):
            monkeypatch.setenv("DATABASE_URL", url)
        else:
            monkeypatch.delenv("DATABASE_URL", raising=False)
        get_settings.cache_clear()
        try:
            yield url, tmp_path
        finally:
            monkeypatch.undo()
            get_settings.cache_clear()


def test_a_process_dying_after_a_status_change_loses_no_webhook(db):
    url, data = db
    storage = LocalStorage(data)
    store = JobStore(storage, listeners=[webhooks.status_recorder(storage)], url=url)
    job_id = str(uuid.uuid4())
    webhooks.set_job_url(job_id, "http://127.0.0.1:9/hook", storage)
    store.create(job_id, "image", {}, {}, owner="k-outbox")
    assert [d.event.data["status"] for d in webhooks.deliveries(job_id, storage)] == ["queued"]
    env = {**os.environ, "DATA_DIR": str(data), "DATABASE_URL": url}
    out = subprocess.run(
        [sys.executable, "-c", DIES_AFTER_COMMIT, url, str(data), job_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 9, out.stderr
    status = store.get(job_id).status
    sent = [d.event.data["status"] for d in webhooks.deliveries(job_id, storage)]
    assert status == JobStatus.running, status  # the change committed before the death...
    assert sent == ["queued", "running"], sent  # ...and so did its delivery


WRITER = """
import sys
from core import webhooks
from core.storage import LocalStorage
from core.store import JobStore
from api_schemas.jobs import JobStatus
from api_schemas.webhooks import WebhookEventType

url, data_dir, job_id, what = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
storage = LocalStorage(data_dir)
store = JobStore(storage, listeners=[webhooks.status_recorder(storage)], url=url)
for i in range(20):
    if what == "status":
        store.set_status(job_id, JobStatus.running if i % 2 == 0 else JobStatus.queued)
    else:
        webhooks.record_event(storage, job_id, WebhookEventType.export_finished, {"i": i})
"""


def test_status_and_export_deliveries_written_at_once_are_numbered_in_order(db):
    url, data = db
    storage = LocalStorage(data)
    store = JobStore(storage, listeners=[webhooks.status_recorder(storage)], url=url)
    job_id = str(uuid.uuid4())
    webhooks.set_job_url(job_id, "http://127.0.0.1:9/hook", storage)
    store.create(job_id, "image", {}, {}, owner="k-outbox")
    env = {**os.environ, "DATA_DIR": str(data), "DATABASE_URL": url}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, str(data), job_id, what],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for what in ("status", "export")
    ]
    for p in procs:
        assert p.wait(120) == 0, p.stderr.read()
    got = webhooks.deliveries(job_id, storage)
    assert [int(d.id) for d in got] == list(range(1, 42))
    exports = [d.event.data["i"] for d in got if d.event.type == WebhookEventType.export_finished]
    assert exports == list(range(20))
