"""The typed task contract (api_schemas/tasks.py) across real processes: a path request without
a format renders the schema's default format (webp) whether it comes through the API or as a
message in the older positional form that names no format; a message that does not validate
fails its render job with the reason instead of rendering something else."""

from __future__ import annotations

import time

import pytest

from api_schemas.render import PathRequest
from core import path_jobs
from core.settings import Settings
from core.storage import LocalStorage
from tests.support.scenes import scene_upload, train_scene

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

CONFIG = {
    "steps": 30,
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
PATH = {"width": 16, "height": 12, "orbit": {"radius": 3.5, "n_frames": 2}}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tests.support.stack import stack_maker

    with stack_maker(tmp_path_factory) as make:
        stack = make()
        yield stack, train_scene(stack, scene_upload(24, 8, 2), "nerf", CONFIG)["id"]


def poll(stack, job_id: str, render_id: str, timeout: float = 60) -> dict:
    url, deadline = f"/v1/jobs/{job_id}/renders/{render_id}", time.monotonic() + timeout
    while True:
        state = stack.client.get(url).json()
        if state["status"] in ("succeeded", "failed"):
            return state
        assert time.monotonic() < deadline, f"{state}\n{stack.logs()}"
        time.sleep(0.1)


def is_webp(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def test_a_path_job_without_a_format_is_the_schemas_default(trained):
    stack, job_id = trained
    assert PathRequest.model_fields["format"].default == "webp"
    r = stack.client.post(f"/v1/jobs/{job_id}/render/path", json={**PATH, "mode": "job"})
    assert r.status_code == 202, r.text
    assert r.json()["format"] == "webp"
    state = poll(stack, job_id, r.json()["id"])
    assert state["status"] == "succeeded", state["error"]
    assert state["artifact"].endswith(".webp")
    art = stack.client.get(f"/v1/jobs/{job_id}/artifacts/{state['artifact']}")
    assert art.status_code == 200 and is_webp(art.content)


def _queue_old_form(stack, job_id: str, request: dict) -> str:
    """A path job as an older API queued it: positional args, the request dict as sent."""
    from service.queue import make_client

    paths = LocalStorage(stack.data_dir).paths(job_id)
    render_id = path_jobs.new_id()
    settings = Settings(data_dir=stack.data_dir, redis_url=None, database_url=stack.database_url)
    path_jobs.create(paths, render_id, job_id, "webp", 2, settings=settings)
    client = make_client(settings)
    client.send_task(
        "nf.render_path_job", args=[job_id, render_id, request], queue="render", ignore_result=True
    )
    return render_id


def test_an_old_form_message_without_a_format_validates_to_the_default(trained):
    stack, job_id = trained
    state = poll(stack, job_id, _queue_old_form(stack, job_id, PATH))
    assert state["status"] == "succeeded", state["error"]
    # the worker once restated its own default here (mp4), not the schema's
    assert state["artifact"].endswith(".webp"), state["artifact"]
    art = stack.client.get(f"/v1/jobs/{job_id}/artifacts/{state['artifact']}")
    assert is_webp(art.content)


def test_a_message_that_does_not_validate_fails_its_render_job(trained):
    stack, job_id = trained
    bad = {**PATH, "format": "avi"}
    state = poll(stack, job_id, _queue_old_form(stack, job_id, bad))
    assert state["status"] == "failed"
    assert "invalid render task" in state["error"] and "format" in state["error"], state
