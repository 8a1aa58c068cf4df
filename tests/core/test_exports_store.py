"""core/exports.py on SQLite and PostgreSQL: the same format and options are one export; a
failed export, or a running one whose worker is gone (its lease is free), starts again; one
being run does not; each run is counted, and a run whose worker died counts a loss."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from types import SimpleNamespace

import pytest

from api_schemas.exports import ExportFormat, ExportStatus
from core.exports import ExportNotFound, ExportStore, export_id
from tests.support.databases import KINDS, database

HOLDER = """
import sys, time
from types import SimpleNamespace
from core.exports import ExportStore
settings = SimpleNamespace(database_url=sys.argv[1], data_dir=".", lease_ttl_s=60)
with ExportStore(None, settings).running(sys.argv[2], sys.argv[3]) as claim:
    print("held" if claim else "busy", flush=True)
    time.sleep(60)
"""


@pytest.fixture(params=KINDS)
def store(request, tmp_path):
    with database(request.param, tmp_path) as url:
        settings = SimpleNamespace(database_url=url, data_dir=tmp_path, lease_ttl_s=60)
        yield ExportStore(None, settings), str(uuid.uuid4())


def test_same_request_is_one_export(store):
    exports, job = store
    first, created = exports.create_or_get(job, ExportFormat.glb, {"resolution": 64})
    again, created_again = exports.create_or_get(job, ExportFormat.glb, {"resolution": 64})
    other, created_other = exports.create_or_get(job, ExportFormat.glb, {"resolution": 65})
    assert created and not created_again and created_other
    assert again.id == first.id == export_id("glb", {"resolution": 64}) != other.id
    assert sorted(e.id for e in exports.list(job)) == sorted([first.id, other.id])
    assert exports.list(str(uuid.uuid4())) == []
    with pytest.raises(ExportNotFound):
        exports.get(job, "../../job")


def test_failed_and_orphaned_exports_start_again(store):
    exports, job = store
    e, _ = exports.create_or_get(job, ExportFormat.splat, {})
    exports.update(job, e.id, status=ExportStatus.failed, error="boom")
    again, created = exports.create_or_get(job, ExportFormat.splat, {})
    assert created and again.status == ExportStatus.queued and again.error is None

    # running, and its worker holds the lease: answered as it stands
    exports.update(job, e.id, status=ExportStatus.running)
    with exports.running(job, e.id) as claim:
        assert claim is not None and claim.losses == 0
        state, created = exports.create_or_get(job, ExportFormat.splat, {})
        assert not created and state.status == ExportStatus.running
    # the worker died (here: a process that holds the lease and is killed while holding it)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, exports.settings.database_url, job, e.id],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == b"held"
        assert not exports.create_or_get(job, ExportFormat.splat, {})[1]
        with exports.running(job, e.id) as claim:
            assert claim is None  # a second delivery leaves it to the live worker
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    state, created = exports.create_or_get(job, ExportFormat.splat, {})
    assert created and state.status == ExportStatus.queued
    with exports.running(job, e.id) as claim:
        assert claim is not None and claim.losses == 1 and claim.deliveries == 3
