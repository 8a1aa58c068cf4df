"""JobStore on the database, each test on SQLite and on a PostgreSQL database of its own: no lost
updates from concurrent processes, strictly increasing event seqs, keyset pages that hold every
job once while jobs are added, owner/cancel columns, and PostgreSQL's NOTIFY waking streams."""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing
import threading
import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import update

from api_schemas.jobs import JobStatus, Progress
from core.db.jobs import JobRow
from core.db.notify import make_waker
from core.storage import LocalStorage
from core.store import BadCursor, JobNotFound, JobStore, encode_cursor
from tests.support.databases import KINDS

WORKERS = 4
ROUNDS = 15


@pytest.fixture
def store(db_url, tmp_path):
    storage = LocalStorage(tmp_path / "data")
    storage.ensure()
    return JobStore(storage, url=db_url)


def _new(store: JobStore, owner: str = "h-a") -> str:
    job_id = str(uuid.uuid4())
    store.reserve(job_id, owner)
    store.create(job_id, "image", {"steps": 10}, {})
    return job_id


def _bump(data_dir: str, url: str, job_id: str, rounds: int, start) -> None:
    store = JobStore(LocalStorage(data_dir), url=url)
    start.wait()

    def inc(job):
        job.metrics["n"] = job.metrics.get("n", 0) + 1
        return job

    for i in range(rounds):
        store.update(job_id, inc)
        store.set_progress(job_id, Progress(step=i))


def test_concurrent_updates_from_processes_lose_nothing(store):
    job_id = _new(store)
    ctx = multiprocessing.get_context("fork")
    start = ctx.Event()
    procs = [
        ctx.Process(
            target=_bump, args=(str(store.storage.data_dir), store.url, job_id, ROUNDS, start)
        )
        for _ in range(WORKERS)
    ]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert store.get(job_id).metrics["n"] == WORKERS * ROUNDS
    # One status event from create, one progress event per set_progress: every seq once, in order.
    seqs = [e["id"] for e in store.events(job_id)]
    assert seqs == list(range(1, 2 + WORKERS * ROUNDS))
    assert [e["id"] for e in store.events(job_id, after=7)] == seqs[7:]


def test_keyset_pages_hold_every_job_once_while_jobs_are_added(store):
    made = [_new(store) for _ in range(23)]
    others = [_new(store, owner="h-b") for _ in range(3)]
    # Ties on created_at are ordered by id: the cursor must carry both.
    tie = datetime(2020, 1, 1, tzinfo=UTC)  # older than every page
    with store._session(write=True) as s:
        s.execute(update(JobRow).where(JobRow.id.in_(made[5:12])).values(created_at=tie))
    seen, cursor, pages = [], None, 0
    while True:
        jobs, total = store.list(limit=5, owner="h-a", cursor=cursor)
        seen += [j.id for j in jobs]
        pages += 1
        _new(store)  # newer than every page: never shifts the next one
        if len(jobs) < 5:
            break
        cursor = encode_cursor(jobs[-1])
    assert sorted(seen) == sorted(made) and len(seen) == len(made)
    assert not set(seen) & set(others)
    assert pages == 5
    stamps = [store.get(j).created_at for j in seen]
    assert stamps == sorted(stamps, reverse=True)
    # The offset form still answers, and filters count.
    first, total = store.list(limit=3, offset=2, owner="h-b")
    assert total == 3 and len(first) == 1
    assert store.list(status=JobStatus.running, owner="h-a") == ([], 0)
    # What a client may send instead: never a query (a NUL would even fail PostgreSQL's).
    forged = [["2026-01-01T00:00:00+00:00", "a\x00b"], ["0001-01-01T00:00:00+01:00", made[0]], {}]
    for cursor in ["not-a-cursor", "", *(_b64(json.dumps(f)) for f in forged)]:
        with pytest.raises(BadCursor):
            store.list(cursor=cursor)


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


def test_reserved_row_owner_cancel_and_delete(store):
    job_id = str(uuid.uuid4())
    store.reserve(job_id, "h-a")
    # While the upload runs: owned, counted as active, but no job yet.
    assert store.owner_of(job_id) == "h-a" and not store.exists(job_id)
    assert store.active_count("h-a") == 1
    with pytest.raises(JobNotFound):
        store.get(job_id)
    assert store.list(owner="h-a") == ([], 0)
    store.create(job_id, "image", {}, {})
    assert store.exists(job_id) and store.owner_of(job_id) == "h-a"
    assert not store.cancel_requested(job_id)
    job = store.request_cancel(job_id)
    assert job.status == JobStatus.cancelled and store.cancel_requested(job_id)
    assert [e["data"]["status"] for e in store.events(job_id)] == ["queued", "cancelled"]
    # A running job keeps running: the trainer sees the flag.
    other = _new(store)
    store.set_status(other, JobStatus.running)
    assert store.request_cancel(other).status == JobStatus.running
    assert store.cancel_requested(other)
    assert store.counts() == {("image", "cancelled"): 1, ("image", "running"): 1}
    store.reserve(str(uuid.uuid4()), "h-a")  # not a job yet: not counted
    assert sum(store.counts().values()) == 2
    assert store.rename_owner("h-a", "h-z") == 3 and store.owner_of(job_id) == "h-z"
    store.delete(job_id)
    assert not store.exists(job_id) and store.events(job_id) == []
    assert store.poll(job_id) == ([], None)


def test_notify_wakes_a_stream_of_the_job(store):
    waker = make_waker(store.url)
    job_id = _new(store)
    other = _new(store)

    async def woken(target: str) -> bool:
        async with waker.subscribe(job_id) as sub:
            await asyncio.sleep(0.5)  # the listener connects
            sub.clear()
            threading.Timer(0.2, store.set_progress, (target, Progress(step=1))).start()
            return await sub.wait(3.0)

    try:
        if not waker.notifying:  # SQLite: streams poll instead
            assert store.url.startswith("sqlite")
            return
        assert asyncio.run(woken(other)) is False  # another job's event wakes nobody here
        assert asyncio.run(woken(job_id)) is True
    finally:
        waker.close()


def _upgrade(url: str, start) -> None:
    from core.db.migrate import upgrade_url

    start.wait()
    upgrade_url(url)


@pytest.mark.parametrize("kind", KINDS)
def test_migrations_apply_at_once_from_several_processes_and_again(kind, tmp_path):
    from core.db.migrate import alembic_config, upgrade_url
    from tests.support.databases import postgres_database

    def run(url: str) -> None:
        from alembic.script import ScriptDirectory
        from sqlalchemy import create_engine, inspect

        ctx = multiprocessing.get_context("fork")
        start = ctx.Event()
        procs = [ctx.Process(target=_upgrade, args=(url, start)) for _ in range(3)]
        for p in procs:
            p.start()
        start.set()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        upgrade_url(url)  # and once more: nothing to do
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").all()
                tables = set(inspect(conn).get_table_names())
        finally:
            engine.dispose()
        assert [v for (v,) in version] == [
            ScriptDirectory.from_config(alembic_config()).get_current_head()
        ]
        assert {"jobs", "job_events"} <= tables

    if kind == "sqlite":
        run(f"sqlite:///{tmp_path / 'fresh.db'}")
    else:
        with postgres_database() as url:
            run(url)


def test_the_migrations_make_the_tables_the_models_describe(db_url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    from core.db.base import Base

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()

    def table_of(diff) -> str | None:
        # ("add_index", Index) / ("add_table", Table) / ("add_column", schema, "t", Column) /
        # [("modify_type", schema, "t", "col", ...)]
        op = diff[0] if isinstance(diff, list) else diff
        for part in op[1:]:
            if isinstance(part, str):
                return part
            if hasattr(part, "table"):
                return part.table.name
            if hasattr(part, "columns"):
                return part.name
        return None

    mine = [d for d in diffs if table_of(d) in ("jobs", "job_events")]
    assert mine == []
