"""Renders cannot starve the API: waiting for a render holds no thread, so 200 renders that
nobody serves leave /healthz and /readyz answering at once, and each render ends in a 504 at
RENDER_TIMEOUT_S. A render worker started afterwards does not run the abandoned tasks
(they expired) and no result is left behind in the result backend."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.support.stack import png_bytes

RENDERS = 200
TIMEOUT_S = 5


# The probes' 1 s bound is judged under this test's own load only (`make test`).
@pytest.mark.alone
def test_200_waiting_renders_leave_the_probes_answering(stack_factory):
    stack = stack_factory(
        queues="train",  # nobody serves renders: each one waits the full RENDER_TIMEOUT_S
        env={
            "RENDER_TIMEOUT_S": str(TIMEOUT_S),
            "RENDER_PIXEL_BURST": "1e9",
            # The 200 expired messages are drained one per poll.
            "BROKER_POLLING_INTERVAL_S": "0.02",
        },
    )
    r = stack.submit(png_bytes(16, 16), config={"steps": 20, "resolution": 16})
    job_id = r.json()["id"]
    assert stack.wait_status(job_id, "succeeded", "failed")["status"] == "succeeded"

    async def scenario():
        limits = httpx.Limits(max_connections=RENDERS + 10)
        async with httpx.AsyncClient(
            base_url=stack.base_url, headers=stack.headers, timeout=60, limits=limits
        ) as client:
            renders = [
                asyncio.create_task(
                    client.post(f"/v1/jobs/{job_id}/render", json={"width": 8, "height": 8})
                )
                for _ in range(RENDERS)
            ]
            await asyncio.sleep(1.5)  # all sent and waiting
            probes = []
            async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as probe:
                for _ in range(6):
                    for path in ("/healthz", "/readyz"):
                        t0 = time.monotonic()
                        resp = await probe.get(path)
                        probes.append((path, resp.status_code, time.monotonic() - t0))
                    await asyncio.sleep(0.3)
            pending = sum(not t.done() for t in renders)
            done = await asyncio.gather(*renders)
            return probes, pending, done

    probes, pending, done = asyncio.run(scenario())
    assert pending > RENDERS // 2, f"only {pending} renders were still waiting during the probes"
    for path, status, took in probes:
        assert status == 200 and took < 1.0, (path, status, took)
    codes = [r.status_code for r in done]
    assert codes == [504] * RENDERS, {c: codes.count(c) for c in set(codes)}
    assert "RENDER_TIMEOUT_S" in done[0].json()["detail"] or "within" in done[0].json()["detail"]

    # The abandoned tasks expired: a render worker that starts now skips them, serves a new
    # render, and no result file is left behind.
    stack.start_worker("render")
    queue_dir = stack.data_dir / "broker" / "queue"
    deadline = time.monotonic() + 60
    while any(queue_dir.iterdir()):
        assert time.monotonic() < deadline, "the expired renders were not drained"
        time.sleep(0.2)
    r = stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": 8, "height": 8})
    assert r.status_code == 200 and r.content[:4] == b"\x89PNG"
    log = (stack.log_dir / "worker-1.log").read_text()
    assert log.count("succeeded in") == 1, "expired renders were run"
    results = stack.data_dir / "results"
    deadline = time.monotonic() + 10
    while left := sorted(p.name for p in results.iterdir()):
        assert time.monotonic() < deadline, json.dumps(left[:5])
        time.sleep(0.2)
