"""core/exports.py on real files: the same format and options are one export; a failed export,
or a running one whose worker is gone (its run lock is free), starts again; one being run does
not."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from api_schemas.exports import ExportFormat, ExportStatus
from core.exports import ExportNotFound, ExportStore, export_id
from core.storage import LocalStorage


@pytest.fixture
def store(tmp_path):
    storage = LocalStorage(tmp_path)
    storage.ensure()
    job_id = str(uuid.uuid4())
    storage.paths(job_id).root.mkdir()
    return ExportStore(storage), job_id


def test_same_request_is_one_export(store):
    exports, job = store
    first, created = exports.create_or_get(job, ExportFormat.glb, {"resolution": 64})
    again, created_again = exports.create_or_get(job, ExportFormat.glb, {"resolution": 64})
    other, created_other = exports.create_or_get(job, ExportFormat.glb, {"resolution": 65})
    assert created and not created_again and created_other
    assert again.id == first.id == export_id("glb", {"resolution": 64}) != other.id
    assert [e.id for e in exports.list(job)] == [first.id, other.id]
    with pytest.raises(ExportNotFound):
        exports.get(job, "../../job")


def test_failed_and_orphaned_exports_start_again(store):
    exports, job = store
    e, _ = exports.create_or_get(job, ExportFormat.splat, {})
    exports.update(job, e.id, status=ExportStatus.failed, error="boom")
    again, created = exports.create_or_get(job, ExportFormat.splat, {})
    assert created and again.status == ExportStatus.queued and again.error is None

    # running, and its worker holds the run lock: answered as it stands
    exports.update(job, e.id, status=ExportStatus.running)
    with exports.running(job, e.id):
        state, created = exports.create_or_get(job, ExportFormat.splat, {})
        assert not created and state.status == ExportStatus.running
    # the worker died (here: a process that takes the lock and is killed while holding it)
    lock = exports._file(job, e.id).with_suffix(".run")
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl,time; f=open({str(lock)!r},'a+');"
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == b"held"
        assert not exports.create_or_get(job, ExportFormat.splat, {})[1]
    finally:
        holder.kill()
        holder.wait()
    state, created = exports.create_or_get(job, ExportFormat.splat, {})
    assert created and state.status == ExportStatus.queued
