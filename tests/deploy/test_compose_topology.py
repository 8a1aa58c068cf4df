"""docker-compose.yml's services, run as local processes, serve a real image job end to end.

Each service's command, environment, volumes and healthcheck come from the compose file
(translated by compose_local.py); Redis is a scratch redis-server on a free port, PostgreSQL a
database this test creates on the local server, MinIO moto's S3 server, and `minio-init` runs its
own command (with a stand-in `mc`) to make the bucket. No folder is shared between the API and
the workers: each service has its own volumes, as in the compose file. Training must
be done by the worker-train process and rendering by the worker-render process, and stopping
the render worker must leave training alone: renders then fail cleanly (504) while the
training still finishes, and a restarted render worker serves again.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support.compose_local import REPO, LocalTopology, free_port, load_compose
from tests.support.databases import postgres_database
from tests.support.stack import TEST_KEY, auth_headers

COMPOSE_FILE = REPO / "docker-compose.yml"
ARTIFACTS = REPO / "test-artifacts" / "compose-topology"
RENDER_TIMEOUT_S = 4.0
WORKER_READY = " ready."  # Celery's line once the worker consumes its queue

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def _photo_png(side: int) -> bytes:
    skimage_data = pytest.importorskip(
        "skimage.data", reason="scikit-image (worker extra) ships the photo"
    )
    from PIL import Image

    img = Image.fromarray(skimage_data.astronaut()).resize((side, side), Image.LANCZOS)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _settings_env_names() -> set[str]:
    from core.settings import Settings

    return {name.upper() for name in Settings.model_fields}


def _celery_hostname(argv: list[str]) -> str:
    (flag,) = [a for a in argv if a.startswith("--hostname=")]
    return flag.split("=", 1)[1].replace("%h", socket.gethostname())


class Stack:
    def __init__(self, tmp: Path, database_url: str, s3_endpoint: str):
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server not installed (apt-get install redis-server)")
        self.tmp = tmp
        self.database_url = database_url
        self.redis_port, self.api_port = free_port(), free_port()
        self.redis = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.redis_port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Defaults of the compose file, not whatever this shell has exported; a bucket of this
        # test's own on the shared S3 server (minio-init makes the one STORAGE_URL names).
        self.bucket = f"nf-topology-{uuid.uuid4().hex[:12]}"
        self.compose = load_compose(COMPOSE_FILE, env={"STORAGE_URL": f"s3://{self.bucket}/nf"})
        base_env = {k: v for k, v in os.environ.items() if k not in _settings_env_names()}
        # Reach the services through the compose file's bare (forwarded) settings.
        base_env.update(
            RENDER_TIMEOUT_S=str(RENDER_TIMEOUT_S),
            TORCH_THREADS="1",
            API_KEYS=f"test:{TEST_KEY}",
            MC_CONFIG_DIR=str(tmp / "mc"),
        )
        self.topology = LocalTopology(
            self.compose,
            tmp,
            {"redis": self.redis_port, "api": self.api_port},
            base_env=base_env,
            provided={"postgres": database_url, "minio": s3_endpoint},
            path=[REPO / "tests" / "support" / "bin"],
        )
        import boto3

        self.s3 = boto3.client(
            "s3",
            endpoint_url=s3_endpoint,
            aws_access_key_id="any",
            aws_secret_access_key="any",
            region_name="us-east-1",
        )
        self.services = {}
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{self.api_port}", timeout=30, headers=auth_headers()
        )

    def start(self, name: str):
        svc = self.topology.service(name)
        svc.start()
        self.services[name] = svc
        return svc

    def init_storage(self) -> None:
        """What compose runs before the API and the workers: the one-shot minio-init, to its
        successful end; then the bucket STORAGE_URL names exists."""
        init = self.start("minio-init")
        assert init.proc.wait(60) == 0, init.log()
        names = [b["Name"] for b in self.s3.list_buckets()["Buckets"]]
        assert self.bucket in names, init.log()

    def events(self, job_id: str) -> list[dict]:
        """The job's events, from the database the services share."""
        from core.storage import LocalStorage
        from core.store import JobStore

        store = JobStore(LocalStorage(self.tmp / "reader"), url=self.database_url)
        return store.events(job_id)

    def latest_checkpoint(self, job_id: str) -> int | None:
        """The step the job's published `latest` pointer names in the bucket."""
        try:
            body = self.s3.get_object(
                Bucket=self.bucket, Key=f"nf/jobs/{job_id}/checkpoints/latest"
            )["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None
        return int(body.decode().strip())

    def celery_client(self):
        from celery import Celery

        return Celery(broker=f"redis://127.0.0.1:{self.redis_port}/0")

    def worker_totals(self, name: str) -> dict[str, int]:
        """Tasks this worker process has executed, by name (Celery's own `inspect stats`)."""
        dest = _celery_hostname(self.topology.service(name).argv)
        stats = self.celery_client().control.inspect(destination=[dest], timeout=10).stats() or {}
        assert dest in stats, f"{dest} did not answer inspect stats; got {list(stats)}"
        return stats[dest]["total"]

    def worker_queues(self, name: str) -> set[str]:
        """Queues this worker process consumes from (Celery's `inspect active_queues`)."""
        dest = _celery_hostname(self.topology.service(name).argv)
        replies = (
            self.celery_client().control.inspect(destination=[dest], timeout=10).active_queues()
            or {}
        )
        assert dest in replies, f"{dest} did not answer inspect active_queues; got {list(replies)}"
        return {q["name"] for q in replies[dest]}

    def close(self):
        self.http.close()
        for svc in reversed(list(self.services.values())):
            svc.stop()
        self.redis.terminate()
        self.redis.wait(10)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for log in (self.tmp / "logs").glob("*.log"):
            shutil.copy(log, ARTIFACTS / log.name)


@pytest.fixture
def compose_stack(tmp_path, s3_server):
    with postgres_database() as url:
        s = Stack(tmp_path, url, s3_server.endpoint)
        try:
            s.init_storage()
            yield s
        finally:
            s.close()


def test_services_share_no_folder(compose_stack):
    """Each service's volumes are folders of its own; the only one two services have in common
    is the host's metric samples."""
    topology = compose_stack.topology
    apps = ("api", "worker-train", "worker-render", "worker-preprocess")
    folders = {name: topology.volumes_of(name) for name in apps}
    for i, a in enumerate(apps):
        for b in apps[i + 1 :]:
            shared = {
                target for target, folder in folders[a].items() if folder in folders[b].values()
            }
            assert shared <= {"/metrics"}, (a, b, shared)
    for name in apps:
        env = topology.service(name).env
        assert env["DATA_DIR"] == str(folders[name]["/data"])
        assert env["DATABASE_URL"] == compose_stack.database_url
        assert env["STORAGE_URL"] == f"s3://{compose_stack.bucket}/nf"


def _submit(http: httpx.Client, photo: bytes, steps: int) -> str:
    r = http.post(
        "/v1/jobs",
        data={"kind": "image", "config": json.dumps({"steps": steps, "resolution": 32})},
        files={"dataset": ("astronaut.png", photo, "image/png")},
    )
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _wait(http: httpx.Client, job_id: str, done, timeout: float, what: str) -> dict:
    end = time.monotonic() + timeout
    job = None
    while time.monotonic() < end:
        job = http.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ("failed", "cancelled"):
            pytest.fail(f"job {job_id} {job['status']}: {job.get('error')}")
        if done(job):
            return job
        time.sleep(0.2)
    pytest.fail(f"job {job_id} not {what} after {timeout}s: {job}")


def _steps_per_s(stack: Stack, job_id: str) -> float:
    progress = [
        e["data"]
        for e in stack.events(job_id)
        if e["event"] == "progress" and e["data"]["step"] > 0
    ]
    first, last = progress[0], progress[-1]
    if last["elapsed_s"] <= first["elapsed_s"]:
        return last["step"] / max(last["elapsed_s"], 0.01)
    return (last["step"] - first["step"]) / (last["elapsed_s"] - first["elapsed_s"])


def _png_size(body: bytes) -> tuple[int, int]:
    from PIL import Image

    return Image.open(io.BytesIO(body)).size


def test_compose_services_run_a_job_and_training_outlives_the_render_worker(compose_stack):
    stack = compose_stack
    api = stack.start("api")
    train = stack.start("worker-train")
    render = stack.start("worker-render")
    # The compose healthchecks themselves decide readiness (readyz; celery inspect ping), a
    # worker's once it has logged that it is ready (a ping before then waits out its timeout).
    api.wait_healthy(180)
    for svc in (train, render):
        svc.wait_healthy(180, after_line=WORKER_READY)
    # Each worker process consumes its own queue only, so losing one cannot stall the other.
    assert stack.worker_queues("worker-train") == {"train"}
    assert stack.worker_queues("worker-render") == {"render"}
    photo = _photo_png(32)

    # A short job: trained by worker-train, rendered by worker-render, at a size it never saw.
    steps1 = 300
    job1 = _submit(stack.http, photo, steps1)
    _wait(stack.http, job1, lambda j: j["status"] == "succeeded", 240, "succeeded")
    r = stack.http.post(f"/v1/jobs/{job1}/render", json={"width": 64, "height": 48})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/png" and _png_size(r.content) == (64, 48)
    assert stack.worker_totals("worker-train") == {"nf.train": 1}
    assert stack.worker_totals("worker-render") == {"nf.render": 1}
    # The trained model is in the bucket, published; nothing of it is on the API's volume.
    assert stack.latest_checkpoint(job1) is not None
    api_data = stack.topology.volumes_of("api")["/data"]
    assert not list(api_data.glob(f"**/{job1}/checkpoints/*"))

    # Size the second job from the first one's steady speed (its progress events in the
    # database), so it is still training when the render worker goes away: ≈15 s here, whatever
    # this CPU's load.
    steps2 = int(min(max(15.0 * _steps_per_s(stack, job1), 500), 200_000))
    job2 = _submit(stack.http, photo, steps2)
    _wait(
        stack.http,
        job2,
        lambda j: j["status"] == "running" and j["progress"]["step"] > 0,
        120,
        "running",
    )

    assert render.stop() == 0, render.log()  # as `docker compose stop worker-render`
    running = stack.http.get(f"/v1/jobs/{job2}").json()
    assert running["status"] == "running", (
        f"training ended before the render worker stopped: {running}"
    )
    assert train.alive()

    # Nobody serves the render queue: the API answers 504 with a reason after RENDER_TIMEOUT_S,
    # and stays ready (the broker is up).
    t0 = time.monotonic()
    r = stack.http.post(f"/v1/jobs/{job1}/render", json={"width": 32, "height": 32})
    waited = time.monotonic() - t0
    assert r.status_code == 504, r.text
    assert "render" in r.json()["detail"]
    assert RENDER_TIMEOUT_S - 0.5 <= waited < RENDER_TIMEOUT_S + 15
    assert stack.http.get("/readyz").status_code == 200

    # Training carries on to the end without the render worker.
    done2 = _wait(stack.http, job2, lambda j: j["status"] == "succeeded", 300, "succeeded")
    assert done2["progress"]["step"] == steps2 == done2["config"]["steps"]
    assert stack.worker_totals("worker-train") == {"nf.train": 2}

    # A render worker started again (same command and environment) serves the queue again.
    render2 = stack.start("worker-render")
    render2.wait_healthy(180, after_line=WORKER_READY)
    r = stack.http.post(f"/v1/jobs/{job2}/render", json={"width": 48, "height": 48})
    assert r.status_code == 200, r.text
    assert _png_size(r.content) == (48, 48)


def _progress_steps(stack: Stack, job_id: str) -> list[int]:
    return [e["data"]["step"] for e in stack.events(job_id) if e["event"] == "progress"]


def test_restarting_the_train_worker_hands_the_training_to_the_next_one(compose_stack):
    """`docker compose stop worker-train` mid-training (an upgrade, a host drain): the compose
    stop_signal hands the job back at once, and the next train worker resumes it from
    its latest checkpoint instead of it waiting out the visibility timeout."""
    stack = compose_stack
    stack.topology.base_env["CHECKPOINT_INTERVAL_S"] = "0.5"  # a checkpoint soon
    api, train = stack.start("api"), stack.start("worker-train")
    api.wait_healthy(180)
    train.wait_healthy(180, after_line=WORKER_READY)
    photo = _photo_png(32)

    job = _submit(stack.http, photo, 100_000)  # far longer than this test waits for one worker
    _wait(stack.http, job, lambda j: j["progress"]["step"] > 200, 120, "training")
    end = time.monotonic() + 30
    while stack.latest_checkpoint(job) is None:
        assert time.monotonic() < end, train.log()
        time.sleep(0.1)

    t0 = time.monotonic()
    assert train.stop() == 0, train.log()
    assert (
        time.monotonic() - t0 < train.stop_grace_s
    )  # stopped by the signal, not killed after the grace
    # The stopped trainer hands the job back (its message acked): queued, and the next train
    # worker's start-up sweep sends it again, so it never waits out a visibility timeout.
    assert stack.http.get(f"/v1/jobs/{job}").json()["status"] == "queued"

    stopped_at = _progress_steps(stack, job)
    checkpoint_step = stack.latest_checkpoint(job)
    train2 = stack.start("worker-train")
    _wait(stack.http, job, lambda j: j["progress"]["step"] > max(stopped_at) + 200, 120, "resumed")
    assert stack.worker_totals("worker-train") == {"nf.train": 1}  # the new process has it

    # The resumed run's first progress is the latest checkpoint's step, not 0.
    resumed_from = _progress_steps(stack, job)[len(stopped_at)]
    assert resumed_from == checkpoint_step > 0, (stopped_at[-5:], resumed_from, checkpoint_step)
    train2.stop()
