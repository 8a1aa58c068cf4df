"""The whole lifecycle on hosts that share no directory: two API replicas and a worker, each in a
network namespace of its own (tests/support/netns.py) with a DATA_DIR and SCRATCH_DIR of its own,
talking to PostgreSQL, Redis and an S3 server (moto) over TCP by the gateway address, as hosts
reach a database server. This process is the client and speaks to the replicas by their
addresses, alternating between them.

One job: photos without poses (SfM on the worker), a splat trained with checkpoints in the
bucket, the worker killed mid-training (its whole process group) and a fresh one on an empty
scratch folder resuming from the bucket's checkpoint, a frame, a path render, an export, their
downloads (302 to a presigned URL on the S3 server), the event stream from the replica that did
not take the upload, listings that agree, and a delete that leaves nothing in the bucket nor in
the database. At the end the replicas' folders hold no job file and the workers' only scratch.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from PIL import Image

from experiments.sfm_capture import make_capture
from tests.support.databases import postgres_database
from tests.support.netns import Forwarder, Host, netns_or_skip
from tests.support.stack import REPO, TEST_KEY, auth_headers, child_pids

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

# The SfM tests' capture: 12 frames at 128 or 16 at 160 pixels register too few photos.
N_FRAMES, SIZE = 24, 200
API_PORT = 8000
KILL_AFTER = 10  # the checkpoint step the first worker must have reached when it is killed
# The tables that hold a job's rows, and the column naming the job.
JOB_ROWS = (
    ("jobs", "id"),
    ("job_events", "job_id"),
    ("exports", "job_id"),
    ("renders", "job_id"),
    ("leases", "job_id"),
    ("job_storage", "job_id"),
)
SPLAT = {
    # enough that the first worker is still training when a checkpoint past KILL_AFTER shows,
    # however fast this machine trains (the kill must land mid-training)
    "steps": 300,
    "init": "points3d",
    "n_test_renders": 0,
    "background": "black",
    "checkpoint_every": 1_000_000,  # checkpoints by CHECKPOINT_INTERVAL_S only
    "time_limit_s": 1800,  # all the steps, however loaded the machine
}


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def kill(self) -> None:
        """SIGKILL the process group: the whole host's process, children included."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGQUIT if "worker" in self.name else signal.SIGTERM)
            try:
                self.popen.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


@dataclass
class Cluster:
    """The hosts, the services they reach and the processes running on them."""

    root: Path
    pg_url: str  # as this process reaches it
    bucket: object  # tests.support.s3.S3Bucket
    redis_port: int
    hosts: dict[str, Host] = field(default_factory=dict)
    forwarders: list[Forwarder] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)

    def host(self, name: str) -> Host:
        host = self.hosts[name] = Host(name)
        return host

    def _forward(self, host: Host, port: int) -> int:
        fwd = Forwarder(host.gateway, 0, "127.0.0.1", port)
        self.forwarders.append(fwd)
        return fwd.address[1]

    def env(self, host: Host, name: str) -> dict[str, str]:
        """The settings of a process on `host`: services by the gateway, folders of its own."""
        gw = host.gateway
        pg = self.pg_url.replace("127.0.0.1:5432", f"{gw}:{self._forward(host, 5432)}")
        s3_port = int(self.bucket.endpoint.rsplit(":", 1)[1])
        home = self.root / name
        # No KEY_ID_SECRET: the replicas must agree on key ids through the database alone.
        unset = ("REDIS_URL", "API_KEYS_FILE", "KEY_ID_SECRET")
        env = {k: v for k, v in os.environ.items() if k not in unset}
        env.update(self.bucket.env)
        env.update(
            {
                "DATA_DIR": str(home / "data"),
                "SCRATCH_DIR": str(home / "scratch"),
                "DATABASE_URL": pg,
                "REDIS_URL": f"redis://{gw}:{self._forward(host, self.redis_port)}/0",
                "S3_ENDPOINT_URL": f"http://{gw}:{self._forward(host, s3_port)}",
                "API_KEYS": f"test:{TEST_KEY}",
                "QUOTA_ACTIVE_JOBS": "1000",
                "QUOTA_JOBS_PER_HOUR": "100000",
                "TORCH_THREADS": "1",
                "SFM_THREADS": "1",
                "SFM_NUM_FRAMES_TARGET": str(N_FRAMES),
                "CHECKPOINT_INTERVAL_S": "0.5",
                # Photos trained at a 96-pixel long side; a dead worker's job requeued in seconds.
                "TRAIN_LONG_SIDE": "96",
                "LEASE_TTL_S": "6",
                "REAPER_INTERVAL_S": "1",
                "PYTHONUNBUFFERED": "1",
                "HOME": str(home),
            }
        )
        return env

    def spawn(self, host: Host, name: str, argv: list[str]) -> Proc:
        env = self.env(host, name)
        for folder in ("data", "scratch"):
            Path(env[f"{folder.upper()}_DIR"]).mkdir(parents=True)
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        popen = subprocess.Popen(
            host.argv(argv),
            cwd=REPO,
            env={**env, "PYTHONPATH": str(REPO)},
            stdout=open(log, "ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def api(self, host: Host, name: str) -> Proc:
        return self.spawn(
            host,
            name,
            [sys.executable, "-m", "uvicorn", "service.app:app", "--host", host.addr]
            + ["--port", str(API_PORT), "--log-level", "warning"],
        )

    def worker(self, host: Host, name: str) -> Proc:
        return self.spawn(
            host,
            name,
            [sys.executable, "-m", "celery", "-A", "worker.app", "worker"]
            + ["-Q", "train,render,preprocess", "-c", "1", "-n", f"{name}@%h"]
            + ["--without-gossip", "--without-mingle", "--loglevel", "info"],
        )

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.log.read_text(errors='replace')[-tail:]}" for p in self.procs
        )

    def close(self) -> None:
        for p in self.procs:
            p.stop()
        for f in self.forwarders:
            f.close()
        for h in self.hosts.values():
            h.close()


@pytest.fixture
def redis_port(tmp_path) -> Iterator[int]:
    """A scratch redis-server of this test's own on 127.0.0.1 (forwarded to the hosts)."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed")
    from tests.support.stack import free_port

    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        import redis

        client = redis.Redis(port=port, socket_connect_timeout=1)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait()


@pytest.fixture
def cluster(tmp_path, s3_bucket, redis_port) -> Iterator[Cluster]:
    netns_or_skip()
    try:
        db = postgres_database()
        pg_url = db.__enter__()
    except Exception as exc:  # psycopg.OperationalError: no server
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432 ({exc})")
    c = Cluster(tmp_path, pg_url, s3_bucket, redis_port)
    try:
        yield c
    finally:
        c.close()
        db.__exit__(None, None, None)


def _wait(
    what: str,
    pred: Callable[[], object],
    cluster: Cluster,
    timeout: float = 120,
    state: Callable[[], object] = lambda: None,
):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.3)
    raise TimeoutError(f"{what} not reached in {timeout}s: {state()}\n{cluster.logs()}")


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.HTTPError:
        return False


def _job_keys(bucket, job_id: str) -> dict[str, int]:
    prefix = f"{bucket.prefix}/jobs/{job_id}/"
    out = {}
    for page in bucket.client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket.bucket, Prefix=prefix
    ):
        out.update({o["Key"][len(prefix) :]: o["Size"] for o in page.get("Contents", ())})
    return out


def _pointer(bucket, job_id: str) -> int | None:
    """The step `checkpoints/latest` names (its objects checked present), or None."""
    try:
        body = bucket.client.get_object(
            Bucket=bucket.bucket, Key=f"{bucket.prefix}/jobs/{job_id}/checkpoints/latest"
        )["Body"].read()
    except bucket.client.exceptions.NoSuchKey:
        return None
    step = int(body)
    keys = _job_keys(bucket, job_id)
    assert {f"checkpoints/step-{step}.json", f"checkpoints/step-{step}.safetensors"} <= set(keys)
    return step


def _download(client: httpx.Client, url: str) -> bytes:
    """An artifact through the API: a 302 to a presigned URL on the S3 server, followed."""
    r = client.get(url)
    assert r.status_code == 302, (r.status_code, r.text)
    location = r.headers["location"]
    assert location.startswith("http://10."), location  # the bucket's address, not the API's
    got = httpx.get(location, timeout=30)  # presigned: no API key
    assert got.status_code == 200, got.text
    return got.content


def _stream(client: httpx.Client, job_id: str, out: list) -> None:
    """The job's SSE stream until `end`, as (event, data) pairs into `out`."""
    event = None
    with client.stream("GET", f"/v1/jobs/{job_id}/events", timeout=300) as r:
        out.append(("http", r.status_code))
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event:
                out.append((event, json.loads(line.split(":", 1)[1])))
                if event == "end":
                    return


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_lifecycle_on_hosts_sharing_no_directory(cluster: Cluster):
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request lines
    t_start = time.monotonic()

    def mark(phase: str) -> None:
        print(f"{time.monotonic() - t_start:7.1f} s  {time.strftime('%H:%M:%S')}  {phase}")

    api_a, api_b, wh = cluster.host("api-a"), cluster.host("api-b"), cluster.host("worker")
    cluster.api(api_a, "api-a")
    cluster.api(api_b, "api-b")
    worker = cluster.worker(wh, "worker-1")
    a = httpx.Client(base_url=f"http://{api_a.addr}:{API_PORT}", headers=auth_headers(), timeout=60)
    b = httpx.Client(base_url=f"http://{api_b.addr}:{API_PORT}", headers=auth_headers(), timeout=60)
    replicas = [a, b]
    _wait("both replicas ready", lambda: _ready(a) and _ready(b), cluster, 60)
    mark("ready")
    capture = make_capture(N_FRAMES, SIZE, n_test=0)

    # upload through A; the stream through B
    r = a.post(
        "/v1/jobs",
        data={"kind": "splat", "config": json.dumps(SPLAT)},
        files={"dataset": ("photos.zip", capture.photos_zip(), "application/zip")},
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    streamed: list = []
    reader = threading.Thread(target=_stream, args=(b, job_id, streamed), daemon=True)
    reader.start()
    assert any(k.startswith("capture/") for k in _job_keys(cluster.bucket, job_id))

    polls = iter(range(1 << 30))

    def job() -> dict:
        got = replicas[next(polls) % 2].get(f"/v1/jobs/{job_id}")
        got.raise_for_status()
        return got.json()

    # SfM on the worker host, then training with checkpoints in the bucket
    def checkpointed() -> int | None:
        j = job()
        assert j["status"] in ("queued", "running"), f"{j['status']}: {j['error']}"
        return (j["progress"].get("checkpoint_step") or 0) >= KILL_AFTER

    _wait("SfM and a checkpoint", checkpointed, cluster, 300, lambda: job()["progress"])
    assert job()["status"] == "running"
    dataset_keys = [k for k in _job_keys(cluster.bucket, job_id) if k.startswith("dataset/")]
    assert "dataset/transforms.json" in dataset_keys or len(dataset_keys) > N_FRAMES, dataset_keys
    assert (cluster.root / "worker-1" / "scratch" / "jobs" / job_id).is_dir()

    # the worker host dies; a fresh one with empty folders takes the job over
    mark("checkpointed")
    worker.kill()
    mark("killed")
    killed_at = _pointer(cluster.bucket, job_id)
    assert killed_at is not None and KILL_AFTER <= killed_at < SPLAT["steps"], killed_at
    assert not child_pids(worker.popen.pid)
    cluster.worker(wh, "worker-2")
    done = _wait(
        "the job resumed and finished",
        lambda: (j := job())["status"] in ("succeeded", "failed") and j,
        cluster,
        240,
    )
    assert done["status"] == "succeeded", (done, cluster.logs())
    mark("trained")

    from core.storage import LocalStorage
    from core.store import JobStore

    events = JobStore(LocalStorage(cluster.root / "probe"), url=cluster.pg_url).events(job_id)
    starts = [
        i
        for i, e in enumerate(events)
        if e["event"] == "status" and e["data"]["status"] == "running"
    ]
    assert len(starts) >= 2, [e["data"].get("status") for e in events if e["event"] == "status"]
    rerun = [e["data"]["step"] for e in events[starts[-1] :] if e["event"] == "progress"]
    # the second worker started from the bucket's checkpoint, not from step 0
    assert rerun and rerun[0] >= killed_at > 0, (killed_at, rerun[:3])
    assert done["metrics"]["steps"] == SPLAT["steps"] == _pointer(cluster.bucket, job_id)

    # the stream opened on B saw the job A took through to its end
    reader.join(timeout=30)
    assert streamed and streamed[0] == ("http", 200), streamed[:3]
    statuses = [d["status"] for e, d in streamed if e == "status"]
    assert statuses[-1] == "succeeded" and "running" in statuses, statuses
    assert streamed[-1][0] == "end" and streamed[-1][1]["status"] == "succeeded"

    # a frame (answered inline, through the bucket) from A
    camera = {"look_at": {"eye": [0, 0, 3], "target": [0, 0, 0], "up": [0, 1, 0]}}
    r = a.post(
        f"/v1/jobs/{job_id}/render",
        json={"width": 40, "height": 32, "mode": "wait", "camera": camera},
    )
    assert r.status_code == 200, r.text
    assert Image.open(io.BytesIO(r.content)).size == (40, 32)
    assert r.headers["x-checkpoint-step"] == str(SPLAT["steps"])

    # a path render job through B, polled on A, its file downloaded from B
    r = b.post(
        f"/v1/jobs/{job_id}/render/path",
        json={"width": 32, "height": 24, "orbit": {"radius": 1.0, "n_frames": 3}, "mode": "job"},
    )
    assert r.status_code == 202, r.text
    path_url = r.json()["url"]
    path_job = _wait(
        "the path render",
        lambda: (p := a.get(path_url).json())["status"] in ("succeeded", "failed") and p,
        cluster,
        120,
    )
    assert path_job["status"] == "succeeded", path_job
    mark("path rendered")
    webp = _download(b, path_job["artifact_url"])
    anim = Image.open(io.BytesIO(webp))
    assert anim.size == (32, 24) and anim.n_frames == 3

    # an export through A, polled on B, downloaded from A
    r = a.post(f"/v1/jobs/{job_id}/exports", json={"format": "splat"})
    assert r.status_code == 202, r.text
    eid = r.json()["id"]
    export = _wait(
        "the export",
        lambda: (
            (e := b.get(f"/v1/jobs/{job_id}/exports/{eid}").json())["status"]
            in ("succeeded", "failed")
            and e
        ),
        cluster,
        120,
    )
    assert export["status"] == "succeeded", export
    mark("exported")
    blob = _download(a, export["url"])
    assert len(blob) == export["size"] > 0 and len(blob) % 32 == 0  # .splat: 32 bytes a gaussian
    stored = _job_keys(cluster.bucket, job_id)
    assert stored[f"artifacts/{export['artifact']}"] == len(blob)

    # listings through both replicas agree
    listed = [{j["id"] for j in c.get("/v1/jobs").json()["items"]} for c in replicas]
    assert listed[0] == listed[1] == {job_id}

    # no file on the replicas' hosts; on the workers' hosts, files in their scratch alone
    for name in ("api-a", "api-b"):
        assert not _files(cluster.root / name), (name, _files(cluster.root / name))
        # nor a folder of the job: the intake's working copy went once its output was stored
        assert not list((cluster.root / name).rglob(job_id)), name
    for name in ("worker-1", "worker-2"):
        scratch = cluster.root / name / "scratch"
        outside = [p for p in _files(cluster.root / name) if not p.is_relative_to(scratch)]
        assert not outside, outside
        assert any(job_id in str(p) for p in _files(scratch)), name

    # delete through B: no object left, no row, gone on both replicas
    assert b.delete(f"/v1/jobs/{job_id}").status_code == 204
    assert _job_keys(cluster.bucket, job_id) == {}
    assert a.get(f"/v1/jobs/{job_id}").status_code == 404
    assert b.get(f"/v1/jobs/{job_id}").status_code == 404
    assert [c.get("/v1/jobs").json()["items"] for c in replicas] == [[], []]
    import psycopg

    with psycopg.connect(cluster.pg_url.replace("+psycopg", "")) as conn:
        for table, column in JOB_ROWS:
            n = conn.execute(f"SELECT count(*) FROM {table} WHERE {column} = %s", (job_id,))
            assert n.fetchone()[0] == 0, table
    mark("deleted")
