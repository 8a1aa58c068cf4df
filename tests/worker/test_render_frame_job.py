"""Frames of any size (issue 25): a frame over RENDER_WAIT_PIXELS is answered 202 with a render
job, rendered by the real render worker in bands of rows, polled over real HTTP until its image
is there; a small frame still comes back directly. The job's frame is the frame a direct render
gives."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest

from experiments.synthetic_scene import FOV_X_DEG
from tests.support.scenes import decode, scene_upload, train_scene
from worker.jobs.scene import TILE_PIXELS

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

WAIT_PIXELS = 2000
CONFIG = {
    "steps": 60,
    "samples_per_step": 4096,
    "max_rays_per_step": 1024,
    "log2_hashmap_size": 14,
    "n_levels": 8,
    "max_resolution": 256,
    "occupancy_resolution": 16,
    "occupancy_warmup_steps": 16,
    "max_samples_per_ray": 96,
    "n_test_renders": 0,
}


@pytest.fixture(scope="module")
def trained(stack_maker_module):
    stack = stack_maker_module(env={"RENDER_WAIT_PIXELS": str(WAIT_PIXELS)})
    scene = scene_upload(24, 8, 2)
    return stack, scene, train_scene(stack, scene, "nerf", CONFIG)


@pytest.fixture(scope="module")
def stack_maker_module(tmp_path_factory):
    from tests.support.stack import stack_maker

    with stack_maker(tmp_path_factory) as make:
        yield make


def poll(stack, url: str, timeout: float = 120) -> tuple[dict, list[int]]:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = stack.client.get(url)
        assert r.status_code == 200, r.text
        state = r.json()
        seen.append(state["pixels_done"])
        if state["status"] in ("succeeded", "failed"):
            return state, seen
        time.sleep(0.1)
    raise AssertionError(f"render job not done in {timeout} s: {state}\n{stack.logs()}")


def test_large_frame_is_a_render_job_then_the_image(trained):
    stack, scene, job = trained
    # More pixels than one band, so the frame is assembled from several.
    width, height = 200, 2 * TILE_PIXELS // 200 + 7
    body = {
        "width": width,
        "height": height,
        "camera": {"c2w": scene["test_c2w"][0]},
        "fov_x_deg": FOV_X_DEG,
    }
    url = f"/v1/jobs/{job['id']}/render"
    r = stack.client.post(url, json=body)
    assert r.status_code == 202, r.text
    state = r.json()
    assert state["kind"] == "frame" and state["n_pixels"] == width * height
    assert r.headers["location"] == state["url"] and state["status"] in ("queued", "running")
    state, seen = poll(stack, state["url"])
    assert state["status"] == "succeeded", state
    assert state["pixels_done"] == width * height and seen == sorted(seen, key=lambda v: v or 0)
    assert state["checkpoint_step"] == CONFIG["steps"]
    got = stack.client.get(state["artifact_url"])
    assert got.status_code == 200 and got.headers["content-type"] == "image/png"
    tiled = np.asarray(decode(got.content).convert("RGB"), dtype=int)
    assert tiled.shape == (height, width, 3)
    # The same frame in one piece (mode wait): the bands join without a seam.
    direct = stack.client.post(url, json={**body, "mode": "wait"})
    assert direct.status_code == 200, direct.text
    whole = np.asarray(decode(direct.content).convert("RGB"), dtype=int)
    assert np.abs(tiled - whole).max() <= 1
    assert tiled.std() > 5  # the scene, not a blank frame


def test_small_frame_is_answered_directly_and_depth_jobs_keep_their_format(trained):
    stack, scene, job = trained
    url = f"/v1/jobs/{job['id']}/render"
    body = {"camera": {"c2w": scene["test_c2w"][1]}, "fov_x_deg": FOV_X_DEG}
    r = stack.client.post(url, json={**body, "width": 40, "height": 30})
    assert r.status_code == 200 and r.headers["x-checkpoint-step"] == str(CONFIG["steps"])
    assert decode(r.content).size == (40, 30)
    # A small frame asked as a job; depth as float32 .npy, as the direct render gives it.
    depth_body = {**body, "width": 40, "height": 30, "output": "depth", "format": "npy"}
    r = stack.client.post(url, json={**depth_body, "mode": "job"})
    assert r.status_code == 202, r.text
    state, _ = poll(stack, r.json()["url"])
    assert state["status"] == "succeeded" and state["artifact"].endswith(".npy"), state
    depth = np.load(io.BytesIO(stack.client.get(state["artifact_url"]).content))
    direct = np.load(io.BytesIO(stack.client.post(url, json=depth_body).content))
    assert depth.shape == (30, 40) and depth.dtype == np.float32
    assert np.array_equal(depth, direct)


def test_bad_render_job_requests_are_4xx(trained):
    stack, _, job = trained
    r = stack.client.post(
        f"/v1/jobs/{job['id']}/render", json={"width": 80, "height": 80, "mode": "later"}
    )
    assert r.status_code == 422
    r = stack.client.get(f"/v1/jobs/{job['id']}/renders/not-a-uuid")
    assert r.status_code == 404
