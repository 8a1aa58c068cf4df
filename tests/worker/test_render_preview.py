"""A running scene job renders its latest checkpoint (a preview while it trains): the render
says which step it shows, and progress events announce each checkpoint as it lands."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from tests.support.scenes import scene_upload

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

CONFIG = {
    "steps": 100_000,  # cancelled once the preview is seen
    "n_init_points": 500,
    "checkpoint_every": 10,
    "n_test_renders": 0,
}


def test_a_running_job_renders_its_latest_checkpoint(stack_factory):
    stack = stack_factory(queues="train")
    stack.start_worker("render")  # renders do not queue behind the training
    scene = scene_upload(24, 10, 2)
    r = stack.submit(
        scene["zip"], "s.zip", kind="splat", config=CONFIG, content_type="application/zip"
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    url = f"/v1/jobs/{job_id}/render"
    body = {"width": 24, "height": 24, "camera": {"c2w": scene["test_c2w"][0]}}
    try:
        job = stack.wait_for(
            job_id,
            lambda j: (
                j["status"] == "running" and (j["progress"].get("checkpoint_step") or 0) >= 20
            ),
            timeout=120,
            what="a second checkpoint",
        )
        r = stack.client.post(url, json=body)
        assert r.status_code == 200, r.text
        step = int(r.headers["x-checkpoint-step"])
        assert step >= job["progress"]["checkpoint_step"]
        im = Image.open(io.BytesIO(r.content))
        assert im.size == (24, 24) and im.text["nf-checkpoint-step"] == str(step)
        # a later checkpoint is rendered once it lands
        stack.wait_for(
            job_id,
            lambda j: (j["progress"].get("checkpoint_step") or 0) > step,
            timeout=60,
            what="a newer checkpoint",
        )
        later = int(stack.client.post(url, json=body).headers["x-checkpoint-step"])
        assert later > step
    finally:
        stack.client.post(f"/v1/jobs/{job_id}/cancel")
    stack.wait_status(job_id, "cancelled", timeout=60)
    r = stack.client.post(url, json=body)
    assert r.status_code == 409 and "cancelled" in r.json()["detail"]
