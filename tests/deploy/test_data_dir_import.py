"""`nf db import`: a DATA_DIR of job folders in the file layout of earlier versions (job.json,
events.jsonl, owner, exports/*.json, renders/*.json, webhook.json and webhooks/*.json beside the
files, and keys/<id>/webhook.json), built here by hand, is
imported into SQLite + the local directory (in place, the one-host upgrade) and into PostgreSQL
+ an S3 bucket (moto's server); then the real API (a uvicorn process) serves the jobs: listing
by owner, events, exports, render jobs, webhook deliveries and settings, artifact downloads.
A second run changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from api_schemas.exports import Export
from api_schemas.jobs import Job, Progress
from api_schemas.webhooks import WebhookDelivery, WebhookEvent
from core.exports import export_id
from service.admin.data_dir_import import job_files
from tests.support.databases import postgres_database
from tests.support.stack import REPO, TEST_KEY, Stack, free_port

SECRET = "import-test-secret"
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def _key_id(token: str) -> str:
    from service.auth import key_id

    return key_id(token, SECRET.encode())


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def _old_layout(data_dir: Path) -> dict:
    """Two job folders as earlier versions wrote them: `mine` (the test key's, succeeded, with
    events, an export, a path render and files) and `theirs` (another key's, failed)."""
    mine, theirs = str(uuid.uuid4()), str(uuid.uuid4())
    eid = export_id("glb", {"resolution": 64})
    rid = str(uuid.uuid4())
    export_file = f"export-{eid}.glb"
    path_file = f"path-{rid}.mp4"
    root = data_dir / "jobs" / mine
    job = Job(
        id=mine,
        kind="nerf",
        status="succeeded",
        created_at=T0,
        updated_at=T0 + timedelta(minutes=5),
        config={"steps": 10},
        dataset={"images": 1},
        metrics={"psnr": 21.5},
        progress=Progress(step=10, total_steps=10),
    )
    _write(root / "job.json", job.model_dump_json())
    events = [
        {"id": 1, "event": "status", "data": {"status": "queued", "updated_at": T0.isoformat()}},
        {"id": 2, "event": "progress", "data": {"step": 5, "total_steps": 10}},
        {
            "id": 3,
            "event": "status",
            "data": {"status": "succeeded", "updated_at": (T0 + timedelta(minutes=5)).isoformat()},
        },
    ]
    lines = "".join(json.dumps(e) + "\n" for e in events) + '{"id": 4, "event": "pro'
    _write(root / "events.jsonl", lines)
    _write(root / "owner", _key_id(TEST_KEY) + "\n")
    _write(root / ".lock", "")
    _write(root / ".job.json.x1y2.tmp", "half a job.json")
    files = {
        "upload/photo.png": b"png-bytes" * 10,
        "dataset/images/0001.png": b"dataset-image",
        "checkpoints/step-10.safetensors": b"tensor-bytes" * 100,
        "checkpoints/step-10.json": b'{"step": 10}',
        "checkpoints/latest": b"10\n",
        f"artifacts/{export_file}": b"glTF-mesh-bytes",
        f"artifacts/{path_file}": b"mp4-bytes",
    }
    for key, data in files.items():
        _write(root / key, data)
    export = Export(
        id=eid,
        job_id=mine,
        format="glb",
        options={"resolution": 64},
        status="succeeded",
        created_at=T0 + timedelta(minutes=6),
        updated_at=T0 + timedelta(minutes=7),
        artifact=export_file,
        url=f"/v1/jobs/{mine}/artifacts/{export_file}",
        size=15,
    )
    _write(root / "exports" / f"{eid}.json", export.model_dump_json())
    _write(root / "exports" / f"{eid}.run", "")
    render = {
        "id": rid,
        "job_id": mine,
        "status": "succeeded",
        "format": "mp4",
        "n_frames": 12,
        "frames_done": 12,
        "checkpoint_step": 10,
        "artifact": path_file,
        "error": None,
        "created_at": (T0 + timedelta(minutes=8)).isoformat(),
        "updated_at": (T0 + timedelta(minutes=9)).isoformat(),
    }
    _write(root / "renders" / f"{rid}.json", json.dumps(render))
    _write(root / "webhook.json", json.dumps({"url": "https://hooks.example.com/job"}))
    for n, status in ((1, "delivered"), (2, "pending")):
        delivery = WebhookDelivery(
            id=f"{n:06d}",
            url="https://hooks.example.com/job",
            event=WebhookEvent(
                id=f"{mine}.{n}",
                type="job.status",
                created_at=T0 + timedelta(minutes=n),
                job_id=mine,
                data={"status": "queued" if n == 1 else "succeeded"},
            ),
            status=status,
            attempts=[{"at": T0.isoformat(), "status_code": 200, "duration_ms": 12.5}]
            if n == 1
            else [],
        )
        _write(root / "webhooks" / f"{n:06d}.json", delivery.model_dump_json())
    key_hook = {"url": "https://hooks.example.com/key", "secret": "whsec-imported"}
    _write(data_dir / "keys" / _key_id(TEST_KEY) / "webhook.json", json.dumps(key_hook))

    other = Job(
        id=theirs,
        kind="image",
        status="failed",
        created_at=T0 + timedelta(hours=1),
        updated_at=T0 + timedelta(hours=1),
        error="out of memory",
    )
    _write(data_dir / "jobs" / theirs / "job.json", other.model_dump_json())
    _write(data_dir / "jobs" / theirs / "owner", _key_id("someone-else-token"))
    _write(
        data_dir / "jobs" / theirs / "events.jsonl",
        json.dumps({"id": 1, "event": "status", "data": {"status": "failed"}}) + "\n",
    )
    return {
        "mine": mine,
        "theirs": theirs,
        "eid": eid,
        "rid": rid,
        "events": events,
        "files": files,
        "export_file": export_file,
        "job": job,
    }


def _run_import(env: dict[str, str], source: Path | None) -> subprocess.CompletedProcess:
    """`nf db import [source]` as an operator runs it: the service's CLI, its environment."""
    args = [sys.executable, "-m", "service.cli", "db", "import"]
    args += [str(source)] if source is not None else []
    r = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _api(tmp: Path, env: dict[str, str]) -> Stack:
    log_dir = tmp / "logs"
    log_dir.mkdir(exist_ok=True)
    stack = Stack(data_dir=Path(env["DATA_DIR"]), log_dir=log_dir, env=env, port=free_port())
    stack.start_api()
    return stack


def _sse_ids(client: httpx.Client, job_id: str) -> list[tuple[int, str]]:
    """(id, event) of the job's SSE stream, read to its end."""
    out, ev_id, event = [], None, None
    with client.stream("GET", f"/v1/jobs/{job_id}/events", timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("id:"):
                ev_id = int(line[3:].strip())
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line == "" and event is not None:
                if ev_id is not None:
                    out.append((ev_id, event))
                if event == "end":
                    break
                ev_id, event = None, None
    return out


def _check_api(stack: Stack, old: dict, s3: bool) -> dict:
    c = stack.client
    listing = c.get("/v1/jobs").json()
    assert [j["id"] for j in listing["items"]] == [old["mine"]] and listing["total"] == 1
    job = c.get(f"/v1/jobs/{old['mine']}").json()
    want = old["job"].model_dump(mode="json")
    for name in ("kind", "status", "config", "dataset", "metrics", "progress"):
        assert job[name] == want[name], name
    assert datetime.fromisoformat(job["created_at"]) == old["job"].created_at
    assert c.get(f"/v1/jobs/{old['theirs']}").status_code == 404  # another key's job

    # Events: the readable lines, ids kept (a client's Last-Event-ID still resumes).
    assert [e["id"] for e in stack.events(old["mine"])] == [1, 2, 3]
    assert [e["data"] for e in stack.events(old["mine"])] == [e["data"] for e in old["events"]]
    streamed = _sse_ids(c, old["mine"])
    assert [i for i, ev in streamed if ev != "end"] == [1, 2, 3]

    exports = c.get(f"/v1/jobs/{old['mine']}/exports").json()["items"]
    assert [(e["id"], e["status"]) for e in exports] == [(old["eid"], "succeeded")]
    render = c.get(f"/v1/jobs/{old['mine']}/renders/{old['rid']}").json()
    assert render["status"] == "succeeded" and render["frames_done"] == 12

    hooks = c.get(f"/v1/jobs/{old['mine']}/webhooks").json()["items"]
    assert [(d["id"], d["status"], len(d["attempts"])) for d in hooks] == [
        ("000001", "delivered", 1),
        ("000002", "pending", 0),
    ]
    assert hooks[1]["event"]["id"] == f"{old['mine']}.2"  # receivers dedupe on it
    assert c.get("/v1/webhook").json() == {
        "url": "https://hooks.example.com/key",
        "has_secret": True,
        "secret": None,
    }

    r = c.get(f"/v1/jobs/{old['mine']}/artifacts/{old['export_file']}")
    if s3:
        assert r.status_code == 302
        r = httpx.get(r.headers["location"])
    assert r.status_code == 200
    assert r.content == old["files"][f"artifacts/{old['export_file']}"]
    return job


def _env(tmp: Path, data_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "API_KEYS_FILE")}
    env.update(
        DATA_DIR=str(data_dir),
        API_KEYS=f"test:{TEST_KEY}",
        KEY_ID_SECRET=SECRET,
        PYTHONUNBUFFERED="1",
        BROKER_POLLING_INTERVAL_S="0.1",
    )
    for name in ("DATABASE_URL", "STORAGE_URL", "S3_ENDPOINT_URL"):
        env.pop(name, None)
    env.update(extra)
    return env


def test_import_in_place_into_sqlite_and_the_local_directory(tmp_path):
    """The one-host upgrade: `nf db import` in the old DATA_DIR itself; the files stay where
    they are and the rows appear in DATA_DIR/service.db."""
    data_dir = tmp_path / "data"
    old = _old_layout(data_dir)
    env = _env(tmp_path, data_dir, {})
    first = _run_import(env, None)
    assert "imported 2 jobs (0 files" in first.stdout, first.stdout

    stack = _api(tmp_path, env)
    try:
        before = _check_api(stack, old, s3=False)
        stack.stop_api()
        second = _run_import(env, None)
        assert "imported 0 jobs" in second.stdout and "2 already there" in second.stdout
        stack.start_api()
        assert stack.client.get(f"/v1/jobs/{old['mine']}").json() == before
        assert len(stack.events(old["mine"])) == 3
    finally:
        stack.stop()
    for key, data in old["files"].items():  # nothing moved or rewritten
        assert (data_dir / "jobs" / old["mine"] / key).read_bytes() == data


def test_import_into_postgresql_and_s3(tmp_path, s3_bucket):
    """Many hosts: the old DATA_DIR imported into PostgreSQL and a bucket; the API runs on a
    DATA_DIR of its own and finds everything there."""
    source = tmp_path / "old-data"
    old = _old_layout(source)
    with postgres_database() as url:
        env = _env(tmp_path, tmp_path / "api-data", {"DATABASE_URL": url, **s3_bucket.env})
        first = _run_import(env, source)
        assert "imported 2 jobs (7 files" in first.stdout, first.stdout
        prefix = f"{s3_bucket.prefix}/jobs/{old['mine']}/"
        keys = {k.removeprefix(prefix) for k in s3_bucket.keys() if k.startswith(prefix)}
        # The job's files, and none of its state files, locks or torn temporaries.
        assert keys == set(old["files"])
        objects = {
            o["Key"]: (o["ETag"], o["LastModified"])
            for o in s3_bucket.client.list_objects_v2(Bucket=s3_bucket.bucket)["Contents"]
        }
        # Stored in this order: the pointer after the checkpoint it names (after everything).
        order = [key for key, _ in job_files(source / "jobs" / old["mine"])]
        assert order[-1] == "checkpoints/latest" and set(order) == set(old["files"])

        stack = _api(tmp_path, env)
        try:
            before = _check_api(stack, old, s3=True)
            second = _run_import(env, source)
            assert "imported 0 jobs (0 files" in second.stdout
            assert "2 already there" in second.stdout
            assert stack.client.get(f"/v1/jobs/{old['mine']}").json() == before
            after = {
                o["Key"]: (o["ETag"], o["LastModified"])
                for o in s3_bucket.client.list_objects_v2(Bucket=s3_bucket.bucket)["Contents"]
            }
            assert after == objects
            assert len(stack.events(old["mine"])) == 3
        finally:
            stack.stop()
