"""GET /v1/jobs/{id}/events against the real stack: a short image job trained by a real
Celery worker, its Server-Sent Events read over real HTTP."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest
from httpx_sse import connect_sse

from tests.support.stack import png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

# Long enough for several progress events (the worker writes one every 0.5 s), short enough
# to keep the module around half a minute on a shared 2-core machine.
SHORT = {"steps": 900, "resolution": 32}


def read_events(
    client: httpx.Client,
    job_id: str,
    headers: dict | None = None,
    params: dict | None = None,
    limit: int | None = None,
) -> list[dict]:
    """Events as {event, data, id, t} until the server closes the stream (or `limit` read)."""
    out = []
    with connect_sse(
        client,
        "GET",
        f"/v1/jobs/{job_id}/events",
        headers=headers or {},
        params=params,
        timeout=httpx.Timeout(30.0),
    ) as source:
        assert source.response.status_code == 200
        assert source.response.headers["content-type"].startswith("text/event-stream")
        for sse in source.iter_sse():
            if not sse.data and sse.event == "message":
                continue  # keep-alive comment
            # Like a browser, httpx-sse carries the last id forward onto events sent without one.
            out.append(
                {
                    "event": sse.event,
                    "data": json.loads(sse.data),
                    "t": time.monotonic(),
                    "id": sse.id or None,
                }
            )
            if limit is not None and len(out) >= limit:
                break
    return out


def logged_events(stack, job_id: str) -> list[dict]:
    return stack.events(job_id)


def with_ids(events: list[dict]) -> list[tuple[int, str, dict]]:
    """The events the server sent from the job's log: those whose id moved (ids only grow, so
    an unchanged id means an event sent without one, a progress repeat or the end)."""
    out, last = [], None
    for ev in events:
        if ev["id"] is not None and ev["id"] != last and ev["event"] != "end":
            out.append((int(ev["id"]), ev["event"], ev["data"]))
        last = ev["id"]
    return out


@pytest.fixture(scope="module")
def finished(fs_stack):
    """One job streamed live from submit to end: (job_id, events seen live)."""
    r = fs_stack.submit(png_bytes(40, 30), config=SHORT)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    events = read_events(fs_stack.client, job_id)
    return job_id, events


def test_live_stream_is_ordered_and_ends(fs_stack, finished):
    job_id, events = finished

    assert events[-1]["event"] == "end", [e["event"] for e in events[-3:]]
    final = events[-1]["data"]
    job = fs_stack.client.get(f"/v1/jobs/{job_id}").json()
    assert final["status"] == job["status"] == "succeeded", final
    assert final["metrics"] == job["metrics"]

    sent = with_ids(events)
    ids = [i for i, _, _ in sent]
    assert ids == sorted(set(ids)), ids
    # Everything in the job's event log reached the client, in the log's order, unchanged.
    assert [(e["id"], e["event"], e["data"]) for e in logged_events(fs_stack, job_id)] == sent

    statuses = [d["status"] for _, ev, d in sent if ev == "status"]
    assert statuses == ["queued", "running", "succeeded"], statuses
    steps = [e["data"]["step"] for e in events if e["event"] == "progress"]
    assert len(steps) >= 3, steps
    assert steps == sorted(steps) and steps[-1] == SHORT["steps"]
    for e in events:
        if e["event"] == "progress" and e["data"]["total_steps"] != SHORT["steps"]:
            # only the keep-alive repeat of the job's progress before the trainer's first report
            assert e["data"]["step"] == 0 and steps[0] == 0, e


def test_progress_at_least_every_second_while_running(finished):
    _, events = finished
    kinds = [(e["event"], e["data"].get("status")) for e in events]
    start = kinds.index(("status", "running"))
    stop = kinds.index(("status", "succeeded"))
    times = [e["t"] for e in events[start : stop + 1]]
    gaps = [b - a for a, b in zip(times, times[1:])]
    # 1 s is the contract; the slack is for a loaded 2-core machine, not for the design.
    assert max(gaps) < 2.0, gaps
    assert all(e["event"] == "progress" for e in events[start + 1 : stop])


def test_replay_after_last_event_id(fs_stack, finished):
    job_id, events = finished
    sent = with_ids(events)
    k = sent[len(sent) // 2][0]

    replay = read_events(fs_stack.client, job_id, headers={"Last-Event-ID": str(k)})
    assert with_ids(replay) == [s for s in sent if s[0] > k]
    assert replay[-1]["event"] == "end" and replay[-1]["data"]["status"] == "succeeded"

    # Clients that cannot set headers (a plain URL) use the query parameter.
    by_query = read_events(fs_stack.client, job_id, params={"last_event_id": str(sent[-1][0])})
    assert [e["event"] for e in by_query] == ["end"]

    full = read_events(fs_stack.client, job_id)
    assert with_ids(full) == sent


def test_reconnect_mid_training_loses_nothing(fs_stack):
    r = fs_stack.submit(png_bytes(40, 30, seed=1), config=SHORT)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]

    first = read_events(fs_stack.client, job_id, limit=4)  # queued, running, 2 progress
    assert [e["event"] for e in first[:2]] == ["status", "status"]
    last_id = first[-1]["id"]
    assert fs_stack.client.get(f"/v1/jobs/{job_id}").json()["status"] == "running"

    rest = read_events(fs_stack.client, job_id, headers={"Last-Event-ID": str(last_id)})
    assert rest[-1]["event"] == "end"
    ids = [i for i, _, _ in with_ids(first) + with_ids(rest)]
    assert ids == list(range(1, len(ids) + 1)), ids  # contiguous: nothing lost, nothing twice
    assert [(e["id"], e["event"], e["data"]) for e in logged_events(fs_stack, job_id)] == with_ids(
        first
    ) + with_ids(rest)


def test_cancel_ends_the_stream(fs_stack):
    r = fs_stack.submit(png_bytes(40, 30, seed=2), config={"steps": 200_000, "resolution": 32})
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    fs_stack.wait_for(job_id, lambda j: j["progress"]["step"] > 0, what="training started")

    events = []
    with connect_sse(
        fs_stack.client, "GET", f"/v1/jobs/{job_id}/events", timeout=httpx.Timeout(30.0)
    ) as source:
        for sse in source.iter_sse():
            if not sse.data:
                continue
            events.append((sse.event, json.loads(sse.data)))
            if sse.event == "progress" and len(events) == 4:
                assert fs_stack.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    assert events[-1][0] == "end" and events[-1][1]["status"] == "cancelled"
    assert ("status", "cancelled") in [(ev, d.get("status")) for ev, d in events]


def test_bad_requests_get_json_details(fs_stack, finished):
    job_id, _ = finished
    unknown = fs_stack.client.get(f"/v1/jobs/{uuid.uuid4()}/events")
    assert unknown.status_code == 404 and "not found" in unknown.json()["detail"]
    not_uuid = fs_stack.client.get("/v1/jobs/..%2F..%2Fetc/events")
    assert not_uuid.status_code == 404 and "detail" in not_uuid.json()
    bad_id = fs_stack.client.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": "seven"})
    assert bad_id.status_code == 422 and "Last-Event-ID" in bad_id.json()["detail"]
