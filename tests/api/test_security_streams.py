"""Event streams: capped per key (MAX_STREAMS_PER_KEY, 429 naming it), and a replay from a
Last-Event-ID starts at that id (an indexed range read of the job's events)."""

from __future__ import annotations

import time

import httpx
from httpx_sse import connect_sse

from tests.support.stack import png_bytes


def test_streams_are_capped_per_key_and_replay_from_the_id(stack_factory):
    stack = stack_factory(queues=None, env={"MAX_STREAMS_PER_KEY": "2"})
    queued = stack.submit(png_bytes(16, 16)).json()["id"]  # nobody trains: its stream stays open
    url = f"/v1/jobs/{queued}/events"
    with httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=30) as c:
        # The context managers are kept: dropping one closes its stream.
        held = [c.stream("GET", url), c.stream("GET", url)]
        first, second = (cm.__enter__() for cm in held)
        assert first.status_code == second.status_code == 200
        r = c.get(url)
        assert r.status_code == 429 and "MAX_STREAMS_PER_KEY" in r.json()["detail"]
        held[0].__exit__(None, None, None)
        deadline = time.monotonic() + 15
        while True:
            with c.stream("GET", url) as r:
                if r.status_code == 200:
                    break
            assert time.monotonic() < deadline, "a closed stream still counted"
            time.sleep(0.3)
        held[1].__exit__(None, None, None)

    # A long history (20000 events after the job was cancelled): a reconnect gets what follows.
    done = stack.submit(png_bytes(16, 16)).json()["id"]
    assert stack.client.post(f"/v1/jobs/{done}/cancel").json()["status"] == "cancelled"
    last = _append_progress(stack, done, 20000)
    with connect_sse(
        stack.client, "GET", f"/v1/jobs/{done}/events", headers={"Last-Event-ID": str(last + 19997)}
    ) as source:
        got = [(ev.event, ev.id) for ev in source.iter_sse()]
    assert got[:3] == [("progress", str(last + i)) for i in (19998, 19999, 20000)]
    assert [e for e, _ in got[3:]] == ["end"]


def _append_progress(stack, job_id: str, n: int) -> int:
    """Log `n` progress events after the job's last one in one statement; the seq before them."""
    from sqlalchemy import insert, select, update

    from core.db.engine import session
    from core.db.jobs import JobEventRow, JobRow
    from core.store import utcnow

    with session(engine=stack.store().engine, write=True) as s:
        last = s.scalar(select(JobRow.last_seq).where(JobRow.id == job_id).with_for_update())
        now = utcnow()
        s.execute(
            insert(JobEventRow),
            [
                {
                    "job_id": job_id,
                    "seq": i,
                    "event": "progress",
                    "data": {"step": i},
                    "created_at": now,
                }
                for i in range(last + 1, last + n + 1)
            ],
        )
        s.execute(update(JobRow).where(JobRow.id == job_id).values(last_seq=last + n))
    return last
