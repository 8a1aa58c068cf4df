"""Waking event streams when a job's events change, without each stream polling on its own.

On PostgreSQL the JobStore sends `NOTIFY nf_job_events, '<job id>'` in the transaction that
inserts an event; one thread per API process LISTENs on a dedicated connection and wakes the
streams of that job. SQLite (the embedded default) has no notifications: one task per API
process reads the `last_seq` of every job some stream follows, in one indexed query every
`SQLITE_POLL_S`, and wakes the streams of the jobs whose seq moved, so the database is read
once per period however many streams are open. Either way a wake-up only means "read again":
the events table stays the source of truth, so a missed wake-up costs latency, never an event.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import select
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

CHANNEL = "nf_job_events"  # core/store.py notifies on it
SQLITE_POLL_S = 0.2


class Subscription:
    """One stream's wake-up flag for one job."""

    def __init__(self) -> None:
        self.flag = asyncio.Event()

    def clear(self) -> None:
        """Call before reading, so a change committed after the read still wakes `wait`."""
        self.flag.clear()

    async def wait(self, timeout: float) -> bool:
        """True when woken by a change, False after `timeout` seconds."""
        try:
            await asyncio.wait_for(self.flag.wait(), timeout)
            return True
        except TimeoutError:
            return False


class EventWaker:
    """Streams re-read on a timer; `notifying` is False."""

    notifying = False

    @asynccontextmanager
    async def subscribe(self, job_id: str) -> AsyncIterator[Subscription]:
        yield Subscription()

    def close(self) -> None:
        pass


class _Subscribers(EventWaker):
    """The streams that follow each job, woken by a subclass's `_wake(job_id)`."""

    notifying = True

    def __init__(self) -> None:
        self._subs: dict[str, set[Subscription]] = {}

    def _started(self) -> None:
        """Start the wake-up source, on the first subscription (on the running loop)."""

    def _unfollowed(self, job_id: str) -> None:
        """The last stream of `job_id` ended."""

    @asynccontextmanager
    async def subscribe(self, job_id: str) -> AsyncIterator[Subscription]:
        self._started()
        sub = Subscription()
        self._subs.setdefault(job_id, set()).add(sub)
        try:
            yield sub
        finally:
            subs = self._subs.get(job_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[job_id]
                    self._unfollowed(job_id)

    def _wake(self, job_id: str) -> None:  # on the event loop
        for sub in self._subs.get(job_id, ()):
            sub.flag.set()


class PgEventWaker(_Subscribers):
    """LISTEN on PostgreSQL; a notification sets the flags of the job's subscriptions."""

    def __init__(self, url: str):
        super().__init__()
        self.dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _started(self) -> None:
        self._start(asyncio.get_running_loop())

    def close(self) -> None:
        self._stop.set()

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive() and self._loop is loop:
                return
            self._loop = loop
            self._thread = threading.Thread(target=self._listen, name="nf-listen", daemon=True)
            self._thread.start()

    def _wake_all(self) -> None:  # on the event loop: after a reconnect, anything may have moved
        for subs in self._subs.values():
            for sub in subs:
                sub.flag.set()

    def _listen(self) -> None:
        import psycopg

        loop = self._loop
        while not self._stop.is_set() and loop is not None and not loop.is_closed():
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    loop.call_soon_threadsafe(self._wake_all)
                    while not self._stop.is_set() and not loop.is_closed():
                        for note in conn.notifies(timeout=1.0):
                            loop.call_soon_threadsafe(self._wake, note.payload)
            except Exception as exc:  # the server restarting, the loop closing
                if self._stop.is_set() or loop.is_closed():
                    return
                log.warning("event notifications: %s; reconnecting", type(exc).__name__)
                self._stop.wait(1.0)


class SqlitePollWaker(_Subscribers):
    """One poll of the followed jobs' `last_seq` per period for the whole process."""

    def __init__(self, url: str, period_s: float = SQLITE_POLL_S):
        super().__init__()
        self.url, self.period_s = url, period_s
        self._seqs: dict[str, int | None] = {}
        self._task: asyncio.Task | None = None

    def _started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())

    def _unfollowed(self, job_id: str) -> None:
        self._seqs.pop(job_id, None)

    def _read(self, job_ids: list[str]) -> dict[str, int]:
        from core.db.engine import engine_for_url, session
        from core.db.jobs import JobRow

        with session(engine=engine_for_url(self.url)) as s:
            rows = s.execute(select(JobRow.id, JobRow.last_seq).where(JobRow.id.in_(job_ids)))
            return {job_id: seq for job_id, seq in rows}

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            followed = list(self._subs)
            if not followed:
                continue
            try:
                seqs = await asyncio.to_thread(self._read, followed)
            except Exception as exc:  # a locked or vanished file: try again next period
                log.warning("event poll: %s", type(exc).__name__)
                continue
            for job_id in followed:
                seq = seqs.get(job_id)  # None: deleted, which its streams must see too
                # A job seen for the first time wakes its streams too: an event may have landed
                # between a stream's read and this poll (one extra read, never a missed event).
                if self._seqs.get(job_id, -1) != seq:
                    self._wake(job_id)
                if job_id in self._subs:
                    self._seqs[job_id] = seq

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


def make_waker(url: str) -> EventWaker:
    """The waker for the database at `url`."""
    if make_url(url).get_backend_name() == "postgresql":
        return PgEventWaker(url)
    return SqlitePollWaker(url)
