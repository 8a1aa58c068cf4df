"""Per-key quotas over real HTTP, on two API replicas sharing Redis and DATA_DIR: the limits
hold across both (parallel submissions cannot both take the last slot), each breach is a
429 (with Retry-After) or 413/422 whose detail names the setting, and `GET /v1/jobs` reads
only the caller's jobs."""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx

from api_schemas.jobs import JobStatus
from core.settings import Settings
from core.storage import get_storage
from core.store import JobStore
from service.auth import ApiKey, id_secret, key_id, record_owner
from service.quotas import KeyIndex
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


def _finished_job_with_files(stack: Stack, token: str, n_files: int) -> str:
    """A cancelled job of `token`'s key, as the store writes one, holding `n_files` empty files:
    every admission of that key walks them under the per-key lock (a few tenths of a second)."""
    settings = Settings(data_dir=stack.data_dir, key_id_secret=None)
    storage = get_storage(settings)
    kid = key_id(token, id_secret(settings))
    job_id, paths = storage.new_job_dir()
    record_owner(paths, ApiKey(kid, "walked"))
    store = JobStore(storage)
    store.create(job_id, "image", {}, {})
    store.set_status(job_id, JobStatus.cancelled)
    KeyIndex(storage).add(kid, job_id)
    files = paths.root / "artifacts"
    files.mkdir()
    for i in range(n_files):
        (files / str(i)).touch()
    return job_id


def test_quotas_hold_across_replicas(stack_factory):
    stack = stack_factory(queues=None, redis_db=7, env=QUOTAS)  # nobody trains: jobs stay queued
    replica = Stack(stack.data_dir, stack.log_dir, stack.env, free_port())
    replica.start_api()
    try:
        one = httpx.Client(base_url=stack.base_url, headers=auth_headers(KEY_A), timeout=30)
        two = httpx.Client(base_url=replica.base_url, headers=auth_headers(KEY_A), timeout=30)

        r = _submit(one, '{"steps": 5000, "resolution": 16}')
        assert r.status_code == 422 and "MAX_TRAIN_STEPS" in r.json()["detail"], r.text

        # Six at once, three to each replica: exactly QUOTA_ACTIVE_JOBS get in. The slow disk
        # walk inside each admission makes the six overlap: without the per-key lock all six
        # would count no active job and all get in.
        _finished_job_with_files(stack, KEY_A, 25_000)
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
        (stack.job_dir(r.json()["id"]) / "artifacts").mkdir(exist_ok=True)
        (stack.job_dir(r.json()["id"]) / "artifacts" / "big.bin").write_bytes(os.urandom(300_000))
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
            assert listed["total"] == 6 and len({j["id"] for j in listed["items"]}) == 6
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
