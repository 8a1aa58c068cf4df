"""docker-compose.yml's services, run as local processes, serve a real image job end to end.

Each service's command, environment, volumes and healthcheck come from the compose file
(translated by compose_local.py); Redis is a scratch redis-server on a free port. Training must
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
from pathlib import Path

import httpx
import pytest

from tests.support.compose_local import REPO, LocalTopology, free_port, load_compose
from tests.support.stack import TEST_KEY, auth_headers

COMPOSE_FILE = REPO / "docker-compose.yml"
ARTIFACTS = REPO / "test-artifacts" / "compose-topology"
RENDER_TIMEOUT_S = 4.0

pytestmark = pytest.mark.timeout(600)


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
    def __init__(self, tmp: Path):
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server not installed (apt-get install redis-server)")
        self.tmp = tmp
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
        # Defaults of the compose file, not whatever this shell has exported.
        self.compose = load_compose(COMPOSE_FILE, env={})
        base_env = {k: v for k, v in os.environ.items() if k not in _settings_env_names()}
        # Reach the services through the compose file's bare (forwarded) settings.
        base_env.update(
            RENDER_TIMEOUT_S=str(RENDER_TIMEOUT_S), TORCH_THREADS="1", API_KEYS=f"test:{TEST_KEY}"
        )
        self.topology = LocalTopology(
            self.compose, tmp, {"redis": self.redis_port, "api": self.api_port}, base_env=base_env
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
def compose_stack(tmp_path):
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.close()


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


def _steps_per_s(tmp: Path, job_id: str) -> float:
    events = (tmp / "volumes" / "data" / "jobs" / job_id / "events.jsonl").read_text().splitlines()
    progress = [
        e["data"]
        for e in map(json.loads, events)
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
    # The compose healthchecks themselves decide readiness (readyz; celery inspect ping).
    for svc in (api, train, render):
        svc.wait_healthy(180)
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

    # Size the second job from the first one's steady speed (its progress events on the data
    # volume), so it is still training when the render worker goes away: ≈15 s here, whatever
    # this CPU's load.
    steps2 = int(min(max(15.0 * _steps_per_s(stack.tmp, job1), 500), 200_000))
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
    render2.wait_healthy(180)
    r = stack.http.post(f"/v1/jobs/{job2}/render", json={"width": 48, "height": 48})
    assert r.status_code == 200, r.text
    assert _png_size(r.content) == (48, 48)


def _progress_steps(tmp: Path, job_id: str) -> list[int]:
    events = (tmp / "volumes" / "data" / "jobs" / job_id / "events.jsonl").read_text().splitlines()
    return [e["data"]["step"] for e in map(json.loads, events) if e["event"] == "progress"]


def test_restarting_the_train_worker_hands_the_training_to_the_next_one(compose_stack):
    """`docker compose stop worker-train` mid-training (an upgrade, a host drain): the compose
    stop_signal hands the job back at once, and the next train worker resumes it from
    its latest checkpoint instead of it waiting out the visibility timeout."""
    stack = compose_stack
    stack.topology.base_env["CHECKPOINT_INTERVAL_S"] = "0.5"  # a checkpoint soon
    api, train = stack.start("api"), stack.start("worker-train")
    api.wait_healthy(180)
    train.wait_healthy(180)
    photo = _photo_png(32)

    job = _submit(stack.http, photo, 100_000)  # far longer than this test waits for one worker
    _wait(stack.http, job, lambda j: j["progress"]["step"] > 200, 120, "training")
    latest = stack.tmp / "volumes" / "data" / "jobs" / job / "checkpoints" / "latest"
    end = time.monotonic() + 30
    while not latest.exists():
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

    stopped_at = _progress_steps(stack.tmp, job)
    checkpoint_step = int(latest.read_text().strip())
    train2 = stack.start("worker-train")
    _wait(stack.http, job, lambda j: j["progress"]["step"] > max(stopped_at) + 200, 120, "resumed")
    assert stack.worker_totals("worker-train") == {"nf.train": 1}  # the new process has it

    # The resumed run's first progress is the latest checkpoint's step, not 0.
    resumed_from = _progress_steps(stack.tmp, job)[len(stopped_at)]
    assert resumed_from == checkpoint_step > 0, (stopped_at[-5:], resumed_from, checkpoint_step)
    train2.stop()
