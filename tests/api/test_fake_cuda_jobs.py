"""One job of every kind end to end over HTTP on a Celery worker with DEVICE=cuda on the fake
CUDA device (NF_FAKE_CUDA=1, tests/support/fake_cuda.py): upload, train, render a view and a path,
export. A device mix-up anywhere in the task path fails the job with a FakeCudaError. The worker
logs each task's host synchronisations (`fake CUDA: nf.train ...`), printed here."""

from __future__ import annotations

import io
import re
import time

import pytest
from PIL import Image

from tests.support.scenes import scene_upload, train_scene

pytestmark = [pytest.mark.fake_cuda, pytest.mark.slow]

NERF = {
    "steps": 30,
    "samples_per_step": 4096,
    "max_rays_per_step": 256,
    "log2_hashmap_size": 14,
    "n_levels": 4,
    "max_resolution": 64,
    "occupancy_resolution": 16,
    "occupancy_update_every": 4,
    "occupancy_warmup_steps": 8,
    "max_samples_per_ray": 64,
    "n_test_renders": 1,
}
SPLAT = {"steps": 30, "n_init_points": 300, "densify_from": 5, "densify_every": 10, "sh_degree": 1}
VIEW = {
    "width": 24,
    "height": 16,
    "camera": {"look_at": {"eye": [0.0, -3.0, 1.0], "target": [0.0, 0.0, 0.0], "up": [0, 0, 1]}},
}
PATH = {
    "width": 16,
    "height": 12,
    "format": "gif",
    "orbit": {"center": [0, 0, 0], "radius": 3.0, "elevation_deg": 20, "n_frames": 3},
}


@pytest.fixture(scope="module")
def cuda_stack(tmp_path_factory):
    from kernels import _ext
    from tests.support.stack import stack_maker

    # Built (or found built) here, so that a cold build is not timed as the worker's first job.
    for ext in _ext.EXTENSIONS:
        _ext.load(ext, "cpu")
    with stack_maker(tmp_path_factory) as make:
        yield make(env={"DEVICE": "cuda", "NF_FAKE_CUDA": "1"})


def export(stack, job_id: str, body: dict, timeout: float = 60) -> dict:
    r = stack.client.post(f"/v1/jobs/{job_id}/exports", json=body)
    assert r.status_code in (200, 202), r.text
    state, deadline = r.json(), time.monotonic() + timeout
    while state["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, f"export stuck: {state}\n{stack.logs()}"
        time.sleep(0.2)
        state = stack.client.get(f"/v1/jobs/{job_id}/exports/{state['id']}").json()
    assert state["status"] == "succeeded", f"{state}\n{stack.logs()}"
    return state


def render_view_and_path(stack, job_id: str) -> None:
    r = stack.client.post(f"/v1/jobs/{job_id}/render", json=VIEW)
    assert r.status_code == 200, f"{r.text}\n{stack.logs()}"
    assert Image.open(io.BytesIO(r.content)).size == (24, 16)
    r = stack.client.post(f"/v1/jobs/{job_id}/render/path", json=PATH)
    assert r.status_code == 200, f"{r.text}\n{stack.logs()}"
    assert Image.open(io.BytesIO(r.content)).n_frames == 3


_printed: set[str] = set()


def print_syncs(stack) -> None:
    for line in re.findall(r"fake CUDA: nf\..*", stack.logs(tail=100_000)):
        if line not in _printed:
            _printed.add(line)
            print(line)


def test_the_worker_runs_on_the_fake_device(cuda_stack):
    assert "fake CUDA on" in cuda_stack.logs(tail=100_000)


def test_image_job(cuda_stack, photo_png):
    cfg = {"steps": 100, "hidden": 32, "layers": 2, "resolution": 16}
    r = cuda_stack.submit(photo_png, config=cfg)
    assert r.status_code == 202, r.text
    job = cuda_stack.wait_status(r.json()["id"], "succeeded", "failed", timeout=120)
    assert job["status"] == "succeeded", f"{job['error']}\n{cuda_stack.logs()}"
    r = cuda_stack.client.post(f"/v1/jobs/{job['id']}/render", json={"width": 20, "height": 10})
    assert r.status_code == 200, r.text
    assert Image.open(io.BytesIO(r.content)).size == (20, 10)
    print_syncs(cuda_stack)
    # The loss is read back when progress is written (every PROGRESS_INTERVAL_S), not every step.
    line = re.search(
        rf"fake CUDA: nf\.train {job['id']}: (\d+) syncs", cuda_stack.logs(tail=100_000)
    )
    assert line and int(line.group(1)) < 40, line.group(0)  # one a step before


@pytest.fixture(scope="module")
def scene():
    return scene_upload(32, 12, 2)


def test_nerf_job(cuda_stack, scene):
    job_id = train_scene(cuda_stack, scene, "nerf", NERF, timeout=180)["id"]
    render_view_and_path(cuda_stack, job_id)
    state = export(
        cuda_stack, job_id, {"format": "ply", "options": {"threshold": 0.01, "resolution": 32}}
    )
    assert state["artifact"].endswith(".ply")
    print_syncs(cuda_stack)


def test_splat_job(cuda_stack, scene):
    job_id = train_scene(cuda_stack, scene, "splat", SPLAT, timeout=180)["id"]
    render_view_and_path(cuda_stack, job_id)
    state = export(cuda_stack, job_id, {"format": "splat"})
    assert state["artifact"].endswith(".splat")
    print_syncs(cuda_stack)
