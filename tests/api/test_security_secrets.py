"""Secrets and what errors tell (issue 28, part 2), over the real stack: key ids on disk are
HMACs under a server secret and an older deployment's unsalted ids move to them, /readyz checks
at most once a second, the event-stream cap holds across API replicas sharing Redis, the gate
works under a path prefix, a worker's exception text and Redis' address stay out of answers."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import httpx
import pytest
import redis
import torch
from safetensors.torch import save_file
from sqlalchemy import delete

from core.db.engine import session
from core.db.secrets import KEY_ID_SECRET_NAME, SecretRow
from service.auth import legacy_key_id
from tests.api.test_security_gate import _json_array, _raw_post
from tests.support.stack import (
    REDIS_HOST,
    TEST_KEY,
    Stack,
    auth_headers,
    free_port,
    png_bytes,
    redis_port,
)


def test_key_ids_are_hmacs_and_unsalted_ids_move_to_them(stack_factory):
    stack = stack_factory(queues=None)
    job_id = stack.submit(png_bytes(16, 16)).json()["id"]
    owner = stack.store().owner_of(job_id)
    assert owner.startswith("h-") and owner != legacy_key_id(TEST_KEY)
    assert hashlib.sha256(TEST_KEY.encode()).hexdigest()[:12] not in owner
    # made once, kept in the database (shared by replicas), not in a file of this host
    with session(engine=stack.store().engine) as s:
        assert s.get(SecretRow, KEY_ID_SECRET_NAME) is not None
    assert not (stack.data_dir / "keys" / ".id-secret").exists()

    # The same job as an older version left it: owned by the unsalted id, no secret yet.
    stack.stop_api()
    legacy = legacy_key_id(TEST_KEY)
    assert stack.store().rename_owner(owner, legacy) == 1
    if (stack.data_dir / "keys" / owner).exists():  # per-key files, where there are any
        os.replace(stack.data_dir / "keys" / owner, stack.data_dir / "keys" / legacy)
    with session(engine=stack.store().engine, write=True) as s:
        s.execute(delete(SecretRow))
    stack.start_api()
    assert stack.client.get(f"/v1/jobs/{job_id}").status_code == 200
    assert [j["id"] for j in stack.client.get("/v1/jobs").json()["items"]] == [job_id]
    moved = stack.store().owner_of(job_id)
    assert moved.startswith("h-") and moved != owner  # a new secret, a new id
    assert not (stack.data_dir / "keys" / legacy).exists()


def test_readyz_checks_at_most_once_a_second(stack_factory):
    stack = stack_factory(queues=None, redis_db=9)
    client = redis.Redis(host=REDIS_HOST, port=redis_port())
    before = client.info("stats")["total_connections_received"]
    t0 = time.monotonic()
    with httpx.Client(base_url=stack.base_url) as c:
        for _ in range(40):
            assert c.get("/readyz").status_code == 200
    seconds = time.monotonic() - t0
    opened = client.info("stats")["total_connections_received"] - before
    # One check (one broker connection) a second at most, plus a little slack for the clock.
    assert opened <= seconds + 2, f"{opened} Redis connections for 40 probes in {seconds:.1f} s"


@pytest.mark.slow
def test_stream_cap_holds_across_replicas(stack_factory):
    stack = stack_factory(queues=None, redis_db=10, env={"MAX_STREAMS_PER_KEY": "2"})
    replica = Stack(stack.data_dir, stack.log_dir, stack.env, free_port())
    replica.start_api()
    try:
        job_id = stack.submit(png_bytes(16, 16)).json()["id"]  # queued: its stream stays open
        url = f"/v1/jobs/{job_id}/events"
        one = httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=30)
        two = httpx.Client(base_url=replica.base_url, headers=stack.headers, timeout=30)
        held = [one.stream("GET", url), two.stream("GET", url)]
        assert all(cm.__enter__().status_code == 200 for cm in held)
        for c in (one, two):
            with c.stream("GET", url) as r:  # a stream let through would never end: no .get()
                assert r.status_code == 429
                assert "MAX_STREAMS_PER_KEY" in json.loads(r.read())["detail"]
        held[0].__exit__(None, None, None)
        deadline = time.monotonic() + 15
        while True:  # the closed stream's slot comes back, on either replica
            with two.stream("GET", url) as r:
                if r.status_code == 200:
                    break
            assert time.monotonic() < deadline, "a closed stream still counted"
            time.sleep(0.3)
        held[1].__exit__(None, None, None)
    finally:
        replica.stop_api()


def test_gate_under_a_path_prefix(stack_factory, tmp_path):
    stack = stack_factory(queues=None)
    prefixed = Stack(stack.data_dir, tmp_path, stack.env, free_port())
    # A proxy serving the API under /nf strips the prefix and says so with --root-path.
    prefixed.api = prefixed._spawn(
        "api-prefixed",
        [sys.executable, "-m", "uvicorn", "service.app:app", "--port", str(prefixed.port)]
        + ["--root-path", "/nf", "--log-level", "warning"],
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(prefixed.base_url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, prefixed.logs()
            time.sleep(0.2)
        with httpx.Client(base_url=prefixed.base_url, timeout=30) as c:
            assert c.get("/v1/jobs", headers=auth_headers()).status_code == 200
            assert c.get("/v1/jobs").status_code == 401
        half_gib = 512 * 1024 * 1024
        status, took, sent = _raw_post(
            prefixed.port,
            "/v1/jobs",
            {"Content-Length": str(half_gib)},
            _json_array(half_gib),
        )
        assert " 401 " in status and sent < 64 * 1024 * 1024, (status, sent)
    finally:
        prefixed.stop_api()


@pytest.mark.slow
def test_worker_exception_text_stays_in_its_log(stack_factory):
    stack = stack_factory()
    r = stack.submit(png_bytes(16, 16), config={"steps": 20, "resolution": 16})
    job_id = r.json()["id"]
    assert stack.wait_status(job_id, "succeeded", "failed")["status"] == "succeeded"
    # A checkpoint that loads but is not this kind's model: rendering it raises on the worker.
    ckpts = stack.job_dir(job_id) / "checkpoints"
    step = int((ckpts / "latest").read_text())
    save_file({"marker_tensor_xyz": torch.zeros(3)}, str(ckpts / f"step-{step + 1}.safetensors"))
    (ckpts / f"step-{step + 1}.json").write_text(json.dumps({"marker": "/srv/secret/path"}))
    (ckpts / "latest").write_text(str(step + 1))
    r = stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": 8, "height": 8})
    assert r.status_code == 500, r.text
    detail = r.json()["detail"]
    assert "cause is logged" in detail
    assert "marker" not in detail and "/" not in detail.replace("/v1", ""), detail


@pytest.mark.slow
def test_redis_down_is_a_503_without_its_address(stack_factory):
    port = free_port()  # nothing listens there
    stack = stack_factory(queues=None)
    down = Stack(
        stack.data_dir,
        stack.log_dir,
        {**stack.env, "REDIS_URL": f"redis://127.0.0.1:{port}/0"},
        free_port(),
    )
    down.start_api(ready_path="/healthz")
    try:
        r = down.submit(png_bytes(16, 16))
        assert r.status_code == 503, r.text
        assert str(port) not in r.text and "127.0.0.1" not in r.text, r.text
    finally:
        down.stop_api()


@pytest.mark.slow
def test_job_error_names_no_server_path(stack_factory):
    stack = stack_factory(queues=None)
    job_id = stack.submit(png_bytes(16, 16), config={"steps": 5, "resolution": 16}).json()["id"]
    for photo in (stack.job_dir(job_id) / "dataset").iterdir():
        photo.unlink()  # training will fail opening it, with its absolute path in the exception
    stack.start_worker()
    job = stack.wait_status(job_id, "failed", "succeeded")
    assert job["status"] == "failed", job
    assert str(stack.data_dir) not in job["error"] and "/jobs/" not in job["error"], job["error"]
    assert "dataset/" in job["error"] or "image" in job["error"], job["error"]
