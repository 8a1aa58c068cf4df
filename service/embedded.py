"""`make run`: the API plus one embedded Celery worker on every queue (train, render,
preprocess), as one unit.

Without REDIS_URL both talk through Celery's filesystem broker under DATA_DIR, so nothing
else needs to run. Ctrl-C (or SIGTERM) stops both."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import uvicorn

from core.process import set_parent_death_signal, worker_env
from core.settings import Settings, get_settings
from service.auth import DEV_KEY


def use_dev_key_if_none() -> bool:
    """`make run` with no key configured gets the documented dev key (README), said loudly."""
    probe = Settings()
    if probe.api_keys or probe.api_keys_file:
        return False
    os.environ["API_KEYS"] = f"dev:{DEV_KEY}"
    get_settings.cache_clear()
    print(
        f"WARNING: no API_KEYS / API_KEYS_FILE set: using the development key {DEV_KEY!r} "
        f"(send `Authorization: Bearer {DEV_KEY}`). Anyone who can reach this port can use it; "
        f"set API_KEYS before exposing the service.",
        file=sys.stderr,
        flush=True,
    )
    return True


# The long side scene photos train at when the embedded worker trains on the CPU and
# TRAIN_LONG_SIDE is not set: a quarter of the GPU default's pixels (core/settings.py).
CPU_TRAIN_LONG_SIDE = 400


def worker_device_type() -> str:
    """'cpu' or 'cuda': what the embedded worker trains on (DEVICE, else whether its torch sees a
    GPU). Asked of a child Python, since this process never imports torch."""
    device = os.environ.get("DEVICE", "").strip()
    if device:
        return device.split(":")[0]
    probe = "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')"
    try:
        r = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    return r.stdout.strip() or "cpu"


def use_cpu_defaults_if_cpu() -> bool:
    """On a CPU host `make run` trains scenes at CPU_TRAIN_LONG_SIDE unless TRAIN_LONG_SIDE is set:
    the API (which downsizes uploads) and the worker read it from the environment."""
    if os.environ.get("TRAIN_LONG_SIDE") or worker_device_type() != "cpu":
        return False
    os.environ["TRAIN_LONG_SIDE"] = str(CPU_TRAIN_LONG_SIDE)
    get_settings.cache_clear()
    print(
        f"worker on the CPU: scene photos train at a {CPU_TRAIN_LONG_SIDE}-pixel long side "
        f"(TRAIN_LONG_SIDE=800 for the GPU default)",
        file=sys.stderr,
        flush=True,
    )
    return True


def worker_command(queues: str = "train,render,preprocess", concurrency: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "worker.app",
        "worker",
        "-Q",
        queues,
        "-c",
        str(concurrency),
        "--loglevel",
        os.environ.get("WORKER_LOGLEVEL", "info"),
        "-n",
        f"embedded-{os.getpid()}@%h",
    ]


def main() -> int:
    use_dev_key_if_none()
    use_cpu_defaults_if_cpu()
    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # The API's /metrics adds up the worker's samples from here (core/metrics.py); the unit
        # starts and stops as one, so last run's files go.
        metrics_dir = settings.data_dir.resolve() / "metrics"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    # The worker gets no API key: it never checks one (core.process.API_ONLY_ENV).
    env = {**worker_env(), "DATA_DIR": str(settings.data_dir.resolve())}
    parent = os.getpid()
    # The worker dies with this process however it dies (SIGKILL, OOM killer): a worker left
    # training with no API in front of it helps nobody. SIGTERM is its warm shutdown, which
    # stops a running training at its next step (worker/tasks.py).
    worker = subprocess.Popen(
        worker_command(),
        env=env,
        start_new_session=True,
        preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM, expected_parent=parent),
    )
    broker = (
        f"Redis at {settings.redis_url}"
        if settings.redis_url
        else f"files under {settings.data_dir.resolve()}"
    )
    print(
        f"API on http://{settings.host}:{settings.port} (docs at /docs); worker pid {worker.pid}; "
        f"broker: {broker}",
        flush=True,
    )

    def stop_worker() -> None:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGTERM)  # warm shutdown; acks_late requeues a cut training
            try:
                worker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()

    # uvicorn re-raises a captured SIGTERM once it has shut down; with the default action that
    # would end this process before `finally` and leave the worker running without a parent.
    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        uvicorn.run("service.app:app", host=settings.host, port=settings.port, log_level="info")
    finally:
        stop_worker()
    return 0


if __name__ == "__main__":
    sys.exit(main())
