"""Webhooks through the real stack: signed POSTs of every status change to a receiver this test
runs on 127.0.0.1, retries with backoff in the delivery log, and refused private URLs."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from core.webhooks import SIGNATURE_HEADER, verify
from tests.support.stack import TEST_KEY, auth_headers, free_port, png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

OTHER_KEY = "other-key-0123456789"
TINY = {"steps": 40, "resolution": 16}
FAST = {"WEBHOOK_ALLOW_PRIVATE": "true", "WEBHOOK_RETRY_BASE_S": "0.3", "WEBHOOK_MAX_ATTEMPTS": "3"}


class Receiver:
    """An HTTP endpoint on 127.0.0.1 that records every POST; the first `fail_first` answer 500."""

    def __init__(self, fail_first: int = 0):
        self.got: list[tuple[float, dict, bytes]] = []
        self.fail_first = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.got.append((time.monotonic(), dict(self.headers), body))
                code = 500 if len(receiver.got) <= receiver.fail_first else 204
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, n: int, timeout: float = 60) -> list[tuple[float, dict, bytes]]:
        deadline = time.monotonic() + timeout
        while len(self.got) < n:
            assert time.monotonic() < deadline, f"{len(self.got)} of {n} POSTs arrived"
            time.sleep(0.05)
        return self.got

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made: list[Receiver] = []

    def make(fail_first: int = 0) -> Receiver:
        made.append(Receiver(fail_first))
        return made[-1]

    yield make
    for r in made:
        r.close()


def _submit(stack, callback_url: str | None = None):
    data = {"kind": "image", "config": json.dumps(TINY)}
    if callback_url is not None:
        data["callback_url"] = callback_url
    return stack.client.post(
        "/v1/jobs", data=data, files={"dataset": ("p.png", png_bytes(24, 20), "image/png")}
    )


def _log(stack, job_id: str, until, timeout: float = 30) -> list[dict]:
    """The job's delivery log once `until(log)` holds (the receiver sees a POST a moment
    before the sender records its answer)."""
    deadline = time.monotonic() + timeout
    while True:
        log = stack.client.get(f"/v1/jobs/{job_id}/webhooks").json()["items"]
        if until(log):
            return log
        assert time.monotonic() < deadline, log
        time.sleep(0.1)


def _secret(stack) -> str:
    r = stack.client.post("/v1/webhook/secret")
    assert r.status_code == 200, r.text
    assert r.json()["secret"].startswith("whsec_")
    shown = stack.client.get("/v1/webhook").json()
    assert shown["has_secret"] and shown["secret"] is None  # shown once only
    return r.json()["secret"]


@pytest.mark.parametrize("broker", ["filesystem", "redis"])
def test_status_changes_arrive_signed_and_in_order(stack_factory, receiver, broker):
    keys = {"API_KEYS": f"test:{TEST_KEY},other:{OTHER_KEY}"}
    stack = stack_factory(redis_db=13 if broker == "redis" else None, env={**FAST, **keys})
    rx = receiver()
    # A callback needs the key's signing secret first.
    r = _submit(stack, rx.url)
    assert r.status_code == 409 and "POST /v1/webhook/secret" in r.json()["detail"]
    secret = _secret(stack)
    r = _submit(stack, rx.url)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    stack.wait_status(job_id, "succeeded", timeout=120)
    got = rx.wait(3)
    events = []
    for _, headers, body in got:
        assert verify(secret, headers[SIGNATURE_HEADER], body), headers
        assert not verify("whsec_wrong", headers[SIGNATURE_HEADER], body)
        assert not verify(secret, headers[SIGNATURE_HEADER], body + b" ")
        assert headers["Content-Type"] == "application/json"
        events.append(json.loads(body))
    assert [e["data"]["status"] for e in events] == ["queued", "running", "succeeded"]
    assert [e["id"] for e in events] == [f"{job_id}.{n}" for n in (1, 2, 3)]
    assert all(e["type"] == "job.status" and e["job_id"] == job_id for e in events)
    assert events[-1]["data"]["metrics"]["psnr"] > 0
    log = _log(stack, job_id, lambda log: [d["status"] for d in log] == ["delivered"] * 3)
    assert all(len(d["attempts"]) == 1 and d["attempts"][0]["status_code"] == 204 for d in log)
    # Another key gets the same 404 as for a job that does not exist.
    other = auth_headers(OTHER_KEY)
    assert stack.client.get(f"/v1/jobs/{job_id}/webhooks", headers=other).status_code == 404


def test_failing_receiver_is_retried_with_backoff(stack_factory, receiver):
    stack = stack_factory(env=FAST)
    rx = receiver(fail_first=2)
    # The key's URL, set once, serves jobs submitted without their own.
    r = stack.client.put("/v1/webhook", json={"url": rx.url})
    assert r.status_code == 200, r.text
    secret = r.json()["secret"]
    assert secret and stack.client.get("/v1/webhook").json() == {
        "url": rx.url,
        "has_secret": True,
        "secret": None,
    }
    r = _submit(stack)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    stack.wait_status(job_id, "succeeded", timeout=120)
    got = rx.wait(5)  # 2 failures, then queued, running, succeeded
    statuses = [json.loads(b)["data"]["status"] for _, _, b in got]
    assert statuses == ["queued", "queued", "queued", "running", "succeeded"]
    assert all(verify(secret, h[SIGNATURE_HEADER], b) for _, h, b in got)
    # Backoff: 0.3 s, then 0.6 s (WEBHOOK_RETRY_BASE_S * 2^(n-1)).
    assert got[1][0] - got[0][0] >= 0.3 and got[2][0] - got[1][0] >= 0.6
    first = _log(stack, job_id, lambda log: log[0]["status"] == "delivered")[0]
    assert [a["status_code"] for a in first["attempts"]] == [500, 500, 204]
    assert [a["error"] for a in first["attempts"]] == ["HTTP 500", "HTTP 500", None]
    times = [datetime.fromisoformat(a["at"]) for a in first["attempts"]]
    assert (times[1] - times[0]).total_seconds() >= 0.3
    assert (times[2] - times[1]).total_seconds() >= 0.6

    # A receiver that never answers: WEBHOOK_MAX_ATTEMPTS (3) attempts, then failed.
    r = _submit(stack, f"http://127.0.0.1:{free_port()}/gone")
    assert r.status_code == 202, r.text
    dead = r.json()["id"]
    log = _log(stack, dead, lambda log: log and log[0]["status"] == "failed")
    assert len(log[0]["attempts"]) == 3
    assert all("ConnectError" in a["error"] for a in log[0]["attempts"])


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://127.0.0.1:8000/hook", "loopback"),
        ("http://localhost/hook", "loopback"),
        ("http://[::1]/hook", "loopback"),
        ("http://10.1.2.3/hook", "private"),
        ("http://192.168.0.10/hook", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://0.0.0.0/hook", "unspecified"),
        ("ftp://example.com/x", "http"),
        ("not a url", "http"),
    ],
)
def test_private_urls_are_refused_by_default(fs_stack, url, words):
    fs_stack.client.post("/v1/webhook/secret")
    before = len(fs_stack.job_dirs())
    r = _submit(fs_stack, url)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("callback_url:") and words in detail, detail
    if words != "http":
        assert "WEBHOOK_ALLOW_PRIVATE" in detail
    assert len(fs_stack.job_dirs()) == before  # nothing kept, nothing queued
    r = fs_stack.client.put("/v1/webhook", json={"url": url})
    assert r.status_code == 422 and words in r.json()["detail"], r.text


def test_a_finished_export_is_posted(stack_factory, receiver):
    """A tiny splat training (one sphere, 20 steps), then a Gaussians export: the receiver
    gets `export.finished` after the job's `succeeded`, with the artifact's URL."""
    import io
    import zipfile

    from experiments.synthetic_scene import Scene, Sphere, scene_files

    stack = stack_factory(env=FAST)
    rx = receiver()
    secret = stack.client.put("/v1/webhook", json={"url": rx.url}).json()["secret"]
    buf = io.BytesIO()
    scene = Scene([Sphere((0.3, -0.2, 0.1), 0.6, ((0.9, 0.2, 0.15), (0.2, 0.3, 0.9)), (8, 4))])
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in scene_files(32, 16, 1, seed=3, scene=scene).items():
            zf.writestr(name, data)
    config = {"steps": 20, "n_init_points": 300, "densify_from": 100, "n_test_renders": 0}
    r = stack.submit(buf.getvalue(), "scene.zip", "splat", config, "application/zip")
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    job = stack.wait_status(job_id, "succeeded", "failed", timeout=240)
    assert job["status"] == "succeeded", job["error"]
    r = stack.client.post(f"/v1/jobs/{job_id}/exports", json={"format": "gaussians"})
    assert r.status_code == 202, r.text
    got = rx.wait(4, timeout=120)
    assert all(verify(secret, h[SIGNATURE_HEADER], b) for _, h, b in got)
    events = [json.loads(b) for _, _, b in got]
    assert [e["type"] for e in events] == ["job.status"] * 3 + ["export.finished"]
    assert events[2]["data"]["status"] == "succeeded"
    export = events[3]["data"]
    assert export["id"] == r.json()["id"] and export["status"] == "succeeded"
    assert stack.client.get(export["url"]).status_code == 200
