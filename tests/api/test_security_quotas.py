"""Per-key quotas over real HTTP, on two API replicas sharing Redis and DATA_DIR: the limits
hold across both (parallel submissions cannot both take the last slot), each breach is a
429 (with Retry-After) or 413/422 whose detail names the setting, and `GET /v1/jobs` reads
only the caller's jobs."""

from __future__ import annotations

import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from core import usage
from core.settings import Settings
from tests.support.stack import Stack, auth_headers, free_port, png_bytes

KEY_A, KEY_B = "alpha-token-1111", "bravo-token-2222"
QUOTAS = {
    "API_KEYS": f"alice:{KEY_A},bob:{KEY_B}",
    "QUOTA_ACTIVE_JOBS": "3",
    "QUOTA_JOBS_PER_HOUR": "6",
    "QUOTA_STORED_MB": "0.2",
    "MAX_TRAIN_STEPS": "1000",
}


def _submit(client: httpx.Client, config: str = '{"steps": 10, "resolution": 16}'):
    return client.post(
        "/v1/jobs",
        data={"kind": "image", "config": config},
        files={"dataset": ("p.png", png_bytes(16, 16), "image/png")},
    )


def _reserved(stack: Stack) -> int:
    """Admitted uploads not yet made into jobs (their rows are `reserved`)."""
    from sqlalchemy import func, select

    from core.db.engine import session
    from core.db.jobs import RESERVED, JobRow

    with session(engine=stack.store().engine) as s:
        return s.scalar(select(func.count()).where(JobRow.status == RESERVED))


def _stored(stack: Stack, job_id: str) -> int:
    from core.db.engine import session
    from core.db.quotas import JobStorage

    with session(engine=stack.store().engine) as s:
        return s.get(JobStorage, job_id).stored_bytes


@pytest.mark.slow
def test_quotas_hold_across_replicas(stack_factory):
    stack = stack_factory(queues=None, redis_db=7, env=QUOTAS)  # nobody trains: jobs stay queued
    replica = Stack(stack.data_dir, stack.log_dir, stack.env, free_port())
    replica.start_api()
    try:
        one = httpx.Client(base_url=stack.base_url, headers=auth_headers(KEY_A), timeout=30)
        two = httpx.Client(base_url=replica.base_url, headers=auth_headers(KEY_A), timeout=30)

        r = _submit(one, '{"steps": 5000, "resolution": 16}')
        assert r.status_code == 422 and "MAX_TRAIN_STEPS" in r.json()["detail"], r.text

        # Six at once, three to each replica: exactly QUOTA_ACTIVE_JOBS get in.
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(_submit, [one, two] * 3))
        codes = sorted(a.status_code for a in answers)
        assert codes == [202] * 3 + [429] * 3, codes
        refused = next(a for a in answers if a.status_code == 429)
        assert "QUOTA_ACTIVE_JOBS" in refused.json()["detail"]
        assert int(refused.headers["retry-after"]) >= 1
        accepted = [a.json()["id"] for a in answers if a.status_code == 202]

        # Finishing one frees a slot; the hourly count (422 + 3 + this one + 1 = 6) then binds.
        assert two.post(f"/v1/jobs/{accepted[0]}/cancel").json()["status"] == "cancelled"
        assert _submit(two).status_code == 202
        assert one.post(f"/v1/jobs/{accepted[1]}/cancel").status_code == 200
        assert _submit(one).status_code == 202
        assert one.post(f"/v1/jobs/{accepted[2]}/cancel").status_code == 200
        r = _submit(two)
        assert r.status_code == 429 and "QUOTA_JOBS_PER_HOUR" in r.json()["detail"], r.text
        assert 3000 < int(r.headers["retry-after"]) <= 3600

        # bob is not limited by alice; his disk use is his own.
        bob = httpx.Client(base_url=replica.base_url, headers=auth_headers(KEY_B), timeout=30)
        r = _submit(bob)
        assert r.status_code == 202
        # As a worker records it after writing a 300 kB artifact.
        usage.record(Settings(database_url=stack.database_url), r.json()["id"], 300_000)
        r = _submit(bob)
        assert r.status_code == 413 and "QUOTA_STORED_MB" in r.json()["detail"], r.text

        # A job folder of another key whose job.json would block any reader (a FIFO): listing
        # answers at once, so it never opens other keys' jobs.
        planted = stack.data_dir / "jobs" / str(uuid.uuid4())
        planted.mkdir()
        (planted / "owner").write_text("k-someone-else")
        os.mkfifo(planted / "job.json")
        for client in (one, two):
            listed = client.get("/v1/jobs", timeout=5).json()
            assert listed["total"] == 5 and len({j["id"] for j in listed["items"]}) == 5
            assert (
                client.get("/v1/jobs", params={"status": "queued"}, timeout=5).json()["total"] == 2
            )
        assert bob.get("/v1/jobs", timeout=5).json()["total"] == 1
    finally:
        replica.stop()


def test_an_upload_larger_than_the_room_left_is_refused_while_streaming(stack_factory):
    """The disk quota is checked before the upload is read; the room it leaves then caps the
    upload itself, so one upload cannot carry a key past QUOTA_STORED_MB."""
    env = {"API_KEYS": f"carol:{KEY_A}", "QUOTA_STORED_MB": "0.2"}  # 209715 bytes
    stack = stack_factory(queues=None, env=env)
    client = httpx.Client(base_url=stack.base_url, headers=auth_headers(KEY_A), timeout=30)
    big = png_bytes(500, 400)  # ~300 KB: over the quota, far under MAX_UPLOAD_MB (512)
    assert len(big) > 209_715
    r = client.post(
        "/v1/jobs", data={"kind": "image"}, files={"dataset": ("big.png", big, "image/png")}
    )
    assert r.status_code == 413 and "QUOTA_STORED_MB" in r.json()["detail"], r.text
    assert stack.job_dirs() == [] and client.get("/v1/jobs").json()["total"] == 0
    # An upload that fits is taken.
    assert _submit(client).status_code == 202


def test_parallel_uploads_share_the_room_left(stack_factory):
    """Six uploads admitted at once (all six are admitted, each told the whole room left,
    before any sends its file) are charged one after the other once stored: exactly as many as
    fit in the room get in, the others are refused naming QUOTA_STORED_MB."""
    env = {"API_KEYS": f"dave:{KEY_A}", "QUOTA_STORED_MB": "0.2", "QUOTA_ACTIVE_JOBS": "20"}
    stack = stack_factory(queues=None, env=env)
    client = httpx.Client(base_url=stack.base_url, headers=auth_headers(KEY_A), timeout=60)
    photo = png_bytes(200, 160)
    first = client.post(
        "/v1/jobs", data={"kind": "image"}, files={"dataset": ("p.png", photo, "image/png")}
    )
    assert first.status_code == 202, first.text
    each = _stored(stack, first.json()["id"])  # every upload below stores the same
    fit = (209_715 - each) // each
    assert 1 <= fit < 6, each

    body_req = client.build_request(
        "POST", "/v1/jobs", data={"kind": "image"}, files={"dataset": ("p.png", photo, "image/png")}
    )
    body = body_req.read()
    all_admitted = threading.Event()

    def upload(_):
        def chunks():
            yield body[:64]
            assert all_admitted.wait(60)
            yield body[64:]

        headers = {
            "Content-Type": body_req.headers["Content-Type"],
            "Content-Length": str(len(body)),
        }
        return client.post("/v1/jobs", content=chunks(), headers=headers)

    with ThreadPoolExecutor(6) as pool:
        answers = pool.map(upload, range(6))
        deadline = time.monotonic() + 30
        while _reserved(stack) < 6:
            assert time.monotonic() < deadline, "the six uploads were not all admitted"
            time.sleep(0.05)
        all_admitted.set()
        answers = list(answers)
    codes = sorted(a.status_code for a in answers)
    assert codes == [202] * fit + [413] * (6 - fit), codes
    refused = next(a for a in answers if a.status_code == 413)
    assert "QUOTA_STORED_MB" in refused.json()["detail"]
    assert client.get("/v1/jobs").json()["total"] == 1 + fit
