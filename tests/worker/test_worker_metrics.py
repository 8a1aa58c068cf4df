"""WORKER_METRICS_PORT: a worker on a host of its own (its own DATA_DIR and metrics folder, which
the API never reads) answers GET /metrics with that host's samples, behind METRICS_TOKEN."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.stack import free_port

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

TOKEN = "worker-metrics-token-0123"


def test_a_worker_host_serves_its_own_metrics(stack_factory, tmp_path):
    stack = stack_factory(queues=None, env={"METRICS_TOKEN": TOKEN})
    port = free_port()
    host = tmp_path / "worker-host"
    stack.start_worker(
        queues="train",
        env={
            "DATA_DIR": str(host / "data"),
            "PROMETHEUS_MULTIPROC_DIR": str(host / "metrics"),
            "WORKER_METRICS_PORT": str(port),
            "WORKER_METRICS_HOST": "127.0.0.1",
        },
    )
    url = f"http://127.0.0.1:{port}/metrics"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url.replace("/metrics", "/other")).status_code == 404
    deadline = time.monotonic() + 30
    while True:
        r = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        beats = [
            line
            for line in r.text.splitlines()
            if line.startswith("nf_worker_heartbeat_timestamp_seconds{")
        ]
        if beats:
            break
        assert time.monotonic() < deadline, r.text[-2000:]
        time.sleep(0.5)
    # the heartbeat is this worker's, and recent
    assert any("worker-0-" in line for line in beats), beats
    assert max(float(line.rsplit(" ", 1)[1]) for line in beats) > time.time() - 30
    # the API's own /metrics (its own empty folder) does not have it: only the worker host does
    api = httpx.get(stack.base_url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert "worker-0-" not in api.text
