"""/metrics and request ids through the real stack: the counters move after a job (the
worker's samples reach the API's /metrics through PROMETHEUS_MULTIPROC_DIR), and the request id
of a submission shows up in the worker's JSON log line."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.stack import png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

TOKEN = "scrape-token-0123"
RID = "req-test-42"


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _get(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_move_and_request_id_reaches_the_worker_log(stack_factory, tmp_path):
    prom = tmp_path / "prom"
    stack = stack_factory(
        env={
            "PROMETHEUS_MULTIPROC_DIR": str(prom),
            "LOG_FORMAT": "json",
            "METRICS_TOKEN": TOKEN,
            "QUOTA_ACTIVE_JOBS": "1",
        }
    )
    url = stack.base_url + "/metrics"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer nope"}).status_code == 401

    def scrape():
        r = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        return _samples(r.text)

    before = scrape()
    form = {"kind": "image", "config": json.dumps({"steps": 300, "resolution": 16})}
    photo = {"dataset": ("p.png", png_bytes(24, 20), "image/png")}
    r = stack.client.post("/v1/jobs", data=form, files=photo, headers={"X-Request-ID": RID})
    assert r.status_code == 202, r.text
    assert r.headers["x-request-id"] == RID
    job_id = r.json()["id"]
    # QUOTA_ACTIVE_JOBS=1: a second job while the first is active is refused, and counted.
    r = stack.client.post("/v1/jobs", data=form, files=photo)
    assert r.status_code == 429, r.text
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])  # made up when not given
    stack.wait_status(job_id, "succeeded", timeout=120)
    r = stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": 32, "height": 32})
    assert r.status_code == 200, r.text
    # A client's id that could forge log lines is replaced.
    r = stack.client.get(f"/v1/jobs/{job_id}", headers={"X-Request-ID": "a b\tc"})
    assert r.headers["x-request-id"] != "a b\tc"

    deadline = time.monotonic() + 15  # the job-store gauges are cached for 5 s
    while True:
        after = scrape()
        if _get(after, "nf_jobs", kind="image", status="succeeded") == 1:
            break
        assert time.monotonic() < deadline, "nf_jobs never showed the succeeded job"
        time.sleep(0.5)
    for status in ("queued", "running", "succeeded"):
        name = "nf_job_status_changes_total"
        assert _get(after, name, kind="image", status=status) == (
            _get(before, name, kind="image", status=status) + 1
        ), status
    duration = {"kind": "image", "status": "succeeded"}
    assert _get(after, "nf_job_duration_seconds_count", **duration) == 1
    assert _get(after, "nf_job_duration_seconds_sum", **duration) > 0
    assert _get(after, "nf_stage_duration_seconds_count", kind="image", stage="train") == 1
    assert _get(after, "nf_quota_refusals_total", limit="QUOTA_ACTIVE_JOBS") == 1
    render = {"route": "/v1/jobs/{job_id}/render", "status": "200"}
    assert _get(after, "nf_render_seconds_count", **render) == 1
    assert ("nf_queue_depth", frozenset({("queue", "train")})) in after
    assert after[("nf_webhook_jobs_pending", frozenset())] == 0  # no callbacks here
    beats = [v for (name, _), v in after.items() if name == "nf_worker_heartbeat_timestamp_seconds"]
    assert beats and time.time() - max(beats) < 30
    routes = {dict(labels).get("route") for (name, labels) in after if name.startswith("nf_http")}
    assert "/v1/jobs/{job_id}" in routes and not any(job_id in (r or "") for r in routes)

    lines = []
    for raw in (stack.log_dir / "worker-0.log").read_text().splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # Celery's banner is not a log line
        if isinstance(line, dict):
            lines.append(line)
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    mine = [line for line in lines if line.get("request_id") == RID]
    assert any(f"nf.train[{job_id}]" in line["message"] for line in mine), lines[-20:]
