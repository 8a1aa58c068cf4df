"""core.db.notify's SQLite waker: streams of a job are woken when its events move, by one poll
of the followed jobs per process, and not by changes to other jobs."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import event

from api_schemas.jobs import JobStatus
from core.db.engine import engine_for_url
from core.db.notify import SqlitePollWaker, make_waker
from core.storage import LocalStorage
from core.store import JobStore


@pytest.fixture
def store(tmp_path):
    url = f"sqlite:///{tmp_path / 'service.db'}"
    return JobStore(LocalStorage(tmp_path), url=url)


def _job(store: JobStore) -> str:
    job_id, _ = store.storage.new_job_dir()
    store.create(job_id, "image", {}, {})
    return job_id


def test_sqlite_streams_wake_on_their_jobs_change_with_one_query_a_period(store):
    waker = make_waker(store.url)
    assert isinstance(waker, SqlitePollWaker)
    watched, other = _job(store), _job(store)
    queries = []
    engine = engine_for_url(store.url)

    def count(conn, cursor, statement, *args):
        if "last_seq" in statement and "FROM jobs" in statement:
            queries.append(statement)

    event.listen(engine, "before_cursor_execute", count)

    async def scenario():
        async with waker.subscribe(watched) as a, waker.subscribe(watched) as b:
            # the first sighting wakes (an event may have landed before it)
            assert await a.wait(2.0)
            for sub in (a, b):
                sub.clear()
            await asyncio.to_thread(store.set_status, other, JobStatus.running)
            assert not await a.wait(0.8), "woken by another job's change"
            n_before = len(queries)
            await asyncio.to_thread(store.set_status, watched, JobStatus.running)
            assert await a.wait(2.0) and await b.wait(0.1)
            return n_before

    try:
        n_before = asyncio.run(scenario())
    finally:
        waker.close()
        event.remove(engine, "before_cursor_execute", count)
    # ~0.2 s a period over ~0.8 s with two streams open: one query per period, not per stream
    assert 2 <= n_before <= 8, n_before


def test_a_deleted_job_wakes_its_streams(store):
    waker = make_waker(store.url)
    job_id = _job(store)

    async def scenario():
        async with waker.subscribe(job_id) as sub:
            await sub.wait(2.0)
            sub.clear()
            await asyncio.to_thread(store.delete, job_id)
            return await sub.wait(2.0)

    try:
        assert asyncio.run(scenario())
    finally:
        waker.close()
