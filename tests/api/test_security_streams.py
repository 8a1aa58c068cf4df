"""Event streams: capped per key (MAX_STREAMS_PER_KEY, 429 naming it), and a replay from a
Last-Event-ID starts at that id by bisecting the file instead of reading the whole history."""

from __future__ import annotations

import io
import json
import time

import httpx
from httpx_sse import connect_sse

from service.api.routes.events import offset_after
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
    events = stack.job_dir(done) / "events.jsonl"
    last = len(events.read_text().splitlines())
    with open(events, "a") as fh:
        for i in range(last + 1, last + 20001):
            fh.write(json.dumps({"id": i, "event": "progress", "data": {"step": i}}) + "\n")
    with connect_sse(
        stack.client, "GET", f"/v1/jobs/{done}/events", headers={"Last-Event-ID": str(last + 19997)}
    ) as source:
        got = [(ev.event, ev.id) for ev in source.iter_sse()]
    assert got[:3] == [("progress", str(last + i)) for i in (19998, 19999, 20000)]
    assert [e for e, _ in got[3:]] == ["end"]


class CountingReader(io.BufferedReader):
    read_bytes = 0

    def read(self, n=-1):
        out = super().read(n)
        self.read_bytes += len(out)
        return out

    def readline(self, n=-1):
        out = super().readline(n)
        self.read_bytes += len(out)
        return out


def test_offset_after_reads_a_few_lines_of_a_long_history(tmp_path):
    path = tmp_path / "events.jsonl"
    lines = [
        json.dumps({"id": i, "event": "progress", "data": {"x": "y" * 200}}) + "\n"
        for i in range(1, 100_001)
    ]
    path.write_text("".join(lines))
    size = path.stat().st_size
    for after, want in [(0, 1), (1, 2), (54321, 54322), (99_999, 100_000), (100_000, None)]:
        with CountingReader(io.FileIO(path, "rb"), buffer_size=4096) as fh:
            off = offset_after(fh, after)
            assert fh.read_bytes < 200_000 < size // 100, (after, fh.read_bytes)
        if want is None:
            assert off == size
        else:
            with open(path, "rb") as raw:
                raw.seek(off)
                assert json.loads(raw.readline())["id"] == want
    # A torn line in the middle only makes the replay start earlier, never later.
    torn = tmp_path / "torn.jsonl"
    torn.write_text("".join(lines[:10]) + '{"id": 11, "ev' + "".join(lines[11:20]))
    with open(torn, "rb") as fh:
        off = offset_after(fh, 12)
        fh.seek(off)
        ids = []
        for line in fh.read().splitlines():
            try:
                ids.append(json.loads(line)["id"])
            except ValueError:
                continue
    assert 13 in ids
