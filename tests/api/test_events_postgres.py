"""The API on PostgreSQL (DATABASE_URL): the listing pages by cursor, and an event stream is woken
by the NOTIFY its job's change sends, well before the streams' idle re-read would find it."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from httpx_sse import connect_sse

from service.api.routes.events import IDLE_S
from tests.support.databases import postgres_database
from tests.support.stack import png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out


def test_stream_and_listing_on_postgresql(stack_factory):
    with postgres_database() as url:
        stack = stack_factory(queues=None, env={"DATABASE_URL": url})  # nobody trains
        try:
            ids = [stack.submit(png_bytes(16, 16, seed=i)).json()["id"] for i in range(3)]
            first = stack.client.get("/v1/jobs", params={"limit": 2}).json()
            rest = stack.client.get(
                "/v1/jobs", params={"limit": 2, "cursor": first["next_cursor"]}
            ).json()
            assert [j["id"] for j in first["items"] + rest["items"]] == ids[::-1]
            assert rest["next_cursor"] is None and first["total"] == 3

            job_id = ids[0]
            got = []
            with (
                httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=30) as other,
                connect_sse(stack.client, "GET", f"/v1/jobs/{job_id}/events") as source,
            ):
                for sse in source.iter_sse():
                    if not sse.data:
                        continue
                    got.append((sse.event, json.loads(sse.data), time.monotonic()))
                    if len(got) == 1:
                        time.sleep(1.0)  # the stream is now asleep until woken or IDLE_S
                        cancelled_at = time.monotonic()
                        assert other.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
            assert [(e, d.get("status")) for e, d, _ in got] == [
                ("status", "queued"),
                ("status", "cancelled"),
                ("end", "cancelled"),
            ]
            assert got[1][2] - cancelled_at < IDLE_S / 2, "the stream was not woken"
        finally:
            stack.stop()
