"""The webhook log and sender without the stack: the send-time address check (a name that
resolves elsewhere after submission) and the signature a receiver verifies."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from api_schemas.webhooks import WebhookEventType
from core import webhooks
from core.db.engine import session
from core.settings import Settings
from core.storage import LocalStorage
from core.store import JobStore
from core.webhook_sender import send_job


def test_send_time_check_refuses_a_url_that_now_resolves_to_loopback(tmp_path):
    hits = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        storage = LocalStorage(tmp_path)
        job_id, paths = storage.new_job_dir()
        store = JobStore(storage)  # the database under tmp_path, migrated
        store.reserve(job_id, "k-test")
        store.create(job_id, "image", {}, {}, owner="k-test")
        webhooks.save_key_settings(storage, "k-test", None, webhooks.new_secret())
        # Accepted when it was submitted (say, a public address then); loopback at send time.
        webhooks.set_job_url(paths, f"http://localhost:{server.server_address[1]}/hook", storage)
        webhooks.record_event(storage, job_id, WebhookEventType.job_status, {"status": "queued"})
        settings = Settings(data_dir=tmp_path, webhook_retry_base_s=0.01, webhook_max_attempts=2)
        send_job(storage, job_id, settings)
        (d,) = webhooks.deliveries(paths, storage)
        assert d.status == "pending" and len(d.attempts) == 1
        assert d.attempts[0].error.startswith("refused:") and "loopback" in d.attempts[0].error
        # The operator allows private addresses: the same delivery goes out, signed.
        allowed = settings.model_copy(update={"webhook_allow_private": True})
        d.next_attempt_at = None
        with session(webhooks.db_settings(storage)) as s:
            webhooks.save_delivery(s, job_id, d)
        send_job(storage, job_id, allowed)
        (d,) = webhooks.deliveries(paths, storage)
        assert d.status == "delivered" and [a.status_code for a in d.attempts] == [None, 204]
        assert hits == ["/hook"]
    finally:
        server.shutdown()
        server.server_close()


def test_signature_verifies_only_the_same_body_secret_and_recent_time():
    body = b'{"id":"x.1"}'
    header = webhooks.signature("whsec_a", 1_000_000, body)
    assert header.startswith("t=1000000,v1=")
    assert webhooks.verify("whsec_a", header, body, now=1_000_100)
    assert not webhooks.verify("whsec_b", header, body, now=1_000_100)
    assert not webhooks.verify("whsec_a", header, body + b" ", now=1_000_100)
    assert not webhooks.verify("whsec_a", header, body, now=1_000_000 + 301)  # replayed later
    assert not webhooks.verify("whsec_a", "v1=abc", body)


def test_a_finished_export_is_logged_once(tmp_path):
    from api_schemas.exports import ExportFormat, ExportStatus
    from core.exports import ExportStore

    storage = LocalStorage(tmp_path)
    job_id, paths = storage.new_job_dir()
    store = JobStore(storage)  # the database under tmp_path, migrated
    store.reserve(job_id, "k-test")
    store.create(job_id, "splat", {}, {}, owner="k-test")
    webhooks.save_key_settings(storage, "k-test", "https://example.com/nf", webhooks.new_secret())
    exports = ExportStore(storage)
    export, _ = exports.create_or_get(job_id, ExportFormat.point_cloud, {})
    webhooks.record_export(storage, job_id, export.id)  # still queued: nothing to tell
    assert webhooks.deliveries(paths, storage) == []
    exports.update(job_id, export.id, status=ExportStatus.succeeded, url="/v1/x", size=3)
    webhooks.record_export(storage, job_id, export.id)
    webhooks.record_export(storage, job_id, export.id)  # a redelivered task
    (d,) = webhooks.deliveries(paths, storage)
    assert d.event.type == "export.finished" and d.url == "https://example.com/nf"
    assert d.event.data["status"] == "succeeded" and d.event.data["id"] == export.id
    assert webhooks.pending_jobs(storage) == 1


def test_a_receiver_trickling_its_answer_is_cut_at_the_timeout(tmp_path):
    """httpx's timeouts are per read: a header byte every 0.2 s would never trip a 1 s one."""
    import socket
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.wait(0.2):
            try:
                conn.sendall(b"X")
            except OSError:
                break
        conn.close()

    threading.Thread(target=trickle, daemon=True).start()
    try:
        storage = LocalStorage(tmp_path)
        job_id, paths = storage.new_job_dir()
        store = JobStore(storage)
        store.reserve(job_id, "k-test")
        store.create(job_id, "image", {}, {}, owner="k-test")
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
        webhooks.save_key_settings(storage, "k-test", url, webhooks.new_secret())
        webhooks.record_event(storage, job_id, WebhookEventType.job_status, {"status": "queued"})
        settings = Settings(data_dir=tmp_path, webhook_allow_private=True, webhook_timeout_s=1)
        t0 = time.monotonic()
        send_job(storage, job_id, settings)
        assert time.monotonic() - t0 < 3
        (d,) = webhooks.deliveries(paths, storage)
        assert d.status == "pending" and "WEBHOOK_TIMEOUT_S" in d.attempts[0].error
    finally:
        stop.set()
        listener.close()
