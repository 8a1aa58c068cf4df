"""A worker that shares no directory with the API: job state in PostgreSQL, files in an S3 bucket
(moto's server), Redis between them, and each worker process with a DATA_DIR of its own.

An image job trains from the upload the API stored in the bucket; its checkpoints land there
(each step's objects complete whenever `latest` names it); the whole worker is killed and a new
one, on an empty DATA_DIR, resumes from the checkpoint it pulls from the bucket; a render comes
back through the bucket and its object is deleted once served."""

from __future__ import annotations

import io
import os
import signal
import time

import httpx
import pytest
from PIL import Image

from tests.support.databases import postgres_database
from tests.support.stack import png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

REDIS_DB = 14


@pytest.fixture
def pg_url():
    from core.db.migrate import upgrade_url

    try:
        with postgres_database() as url:
            upgrade_url(url)
            yield url
    except Exception as exc:  # psycopg.OperationalError: no server
        if "connect" in str(exc).lower():
            pytest.skip(f"no PostgreSQL at 127.0.0.1:5432 ({exc})")
        raise


def _job_keys(s3_bucket, job_id: str) -> dict[str, int]:
    """{key inside the job: size} of the job's objects."""
    prefix = f"{s3_bucket.prefix}/jobs/{job_id}/"
    out = {}
    for page in s3_bucket.client.get_paginator("list_objects_v2").paginate(
        Bucket=s3_bucket.bucket, Prefix=prefix
    ):
        out.update({o["Key"][len(prefix) :]: o["Size"] for o in page.get("Contents", ())})
    return out


def _complete_pointer(s3_bucket, job_id: str) -> int | None:
    """The step `checkpoints/latest` names, checked to have both of its objects."""
    keys = _job_keys(s3_bucket, job_id)
    if "checkpoints/latest" not in keys:
        return None
    body = s3_bucket.client.get_object(
        Bucket=s3_bucket.bucket, Key=f"{s3_bucket.prefix}/jobs/{job_id}/checkpoints/latest"
    )["Body"].read()
    step = int(body)
    keys = _job_keys(s3_bucket, job_id)  # listed after the pointer was read
    assert f"checkpoints/step-{step}.json" in keys, keys
    assert f"checkpoints/step-{step}.safetensors" in keys, keys
    return step


def test_train_checkpoint_kill_resume_and_render_through_s3(
    stack_factory, s3_bucket, pg_url, tmp_path
):
    env = {
        **s3_bucket.env,
        "DATABASE_URL": pg_url,
        "CHECKPOINT_INTERVAL_S": "0.3",
    }
    stack = stack_factory(queues=None, redis_db=REDIS_DB, env=env)
    steps = 1500
    job_id = stack.submit(png_bytes(16, 16), config={"steps": steps, "resolution": 16}).json()["id"]
    assert any(k.startswith("dataset/") for k in _job_keys(s3_bucket, job_id))

    hosts = [tmp_path / "host-1", tmp_path / "host-2"]
    worker = stack.start_worker(env={"DATA_DIR": str(hosts[0])})
    stack.wait_for(job_id, lambda j: j["progress"]["step"] > 200, what="some training")
    deadline = time.monotonic() + 30
    while (first := _complete_pointer(s3_bucket, job_id)) is None:
        assert time.monotonic() < deadline, stack.logs()
        time.sleep(0.1)
    # the worker's files are its own: nothing of the job under the API's DATA_DIR but state
    api_job_dir = stack.data_dir / "jobs" / job_id
    assert not (api_job_dir / "checkpoints").exists()
    assert (hosts[0] / "scratch" / "jobs" / job_id / "checkpoints").is_dir()

    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    killed_at = _complete_pointer(s3_bucket, job_id)
    assert killed_at is not None and killed_at >= first
    assert stack.client.get(f"/v1/jobs/{job_id}").json()["status"] == "running"

    stack.start_worker(env={"DATA_DIR": str(hosts[1])})
    done = stack.wait_status(job_id, "succeeded", "failed", timeout=180)
    assert done["status"] == "succeeded", (done, stack.logs())
    events = stack.events(job_id)
    starts = [
        i
        for i, e in enumerate(events)
        if e["event"] == "status" and e["data"]["status"] == "running"
    ]
    assert len(starts) == 2, [e["data"].get("status") for e in events if e["event"] == "status"]
    rerun = [e["data"]["step"] for e in events[starts[1] :] if e["event"] == "progress"]
    # the second host started from a checkpoint it could only have pulled from the bucket
    assert 0 < rerun[0] < steps and rerun[0] >= killed_at, (killed_at, rerun[:3])
    assert _complete_pointer(s3_bucket, job_id) == steps
    keys = _job_keys(s3_bucket, job_id)
    assert "artifacts/reconstruction.png" in keys, keys

    w, h = done["metrics"]["train_width"], done["metrics"]["train_height"]
    r = stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": w, "height": h})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/png"
    assert r.headers["x-checkpoint-step"] == str(steps)
    # the final checkpoint's field on the training grid: the reconstruction the trainer stored
    reconstruction = s3_bucket.client.get_object(
        Bucket=s3_bucket.bucket,
        Key=f"{s3_bucket.prefix}/jobs/{job_id}/artifacts/reconstruction.png",
    )["Body"].read()
    assert Image.open(io.BytesIO(r.content)).size == (w, h)
    assert (
        Image.open(io.BytesIO(r.content)).tobytes()
        == Image.open(io.BytesIO(reconstruction)).tobytes()
    )
    assert not [k for k in _job_keys(s3_bucket, job_id) if k.startswith("renders/results/")]

    # a frame as a render job: its file stored in the bucket, downloaded through a presigned URL
    r = stack.client.post(
        f"/v1/jobs/{job_id}/render", json={"width": w, "height": h, "mode": "job"}
    )
    assert r.status_code == 202, r.text
    url, deadline = r.json()["url"], time.monotonic() + 60
    while (state := stack.client.get(url).json())["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, (state, stack.logs())
        time.sleep(0.1)
    assert state["status"] == "succeeded", state
    assert f"artifacts/{state['artifact']}" in _job_keys(s3_bucket, job_id)
    r = stack.client.get(f"/v1/jobs/{job_id}/artifacts/{state['artifact']}")
    assert r.status_code == 302, r.text
    frame = httpx.get(r.headers["location"]).content
    assert (
        Image.open(io.BytesIO(frame)).tobytes() == Image.open(io.BytesIO(reconstruction)).tobytes()
    )
