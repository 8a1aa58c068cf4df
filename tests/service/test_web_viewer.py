"""The orbit viewer's client logic in headless Chromium.

The page comes from the real service, but no scene kind can train here yet, so the one
finished `nerf` job it shows is answered by the browser's request interception: GET job,
its event stream, render, render/path and checkpoint. What is under test is the page's
behaviour: the requests it makes (camera, sizes, output) while a person drags, scrolls and
toggles, and that it shows what comes back.
"""

from __future__ import annotations

import io
import json
import math
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from PIL import Image

from api_schemas.render import PathRequest, RenderRequest
from tests.service.test_web import ARTIFACTS, CHROMIUM, FLAGS, KEY_INIT, sync_api  # noqa: F401  (skips like test_web)

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

JOB_ID = str(uuid.uuid4())
NOW = datetime.now(UTC).isoformat()
CENTER, SCALE = [1.0, 2.0, 3.0], 0.5  # normalisation: p_norm = (p - offset) * scale
W, H = 200, 150
JOB = {
    "id": JOB_ID,
    "kind": "nerf",
    "status": "succeeded",
    "created_at": NOW,
    "updated_at": NOW,
    "config": {"steps": 100},
    "error": None,
    "metrics": {"test_psnr": 26.5},
    "progress": {
        "step": 100,
        "total_steps": 100,
        "loss": 0.004,
        "psnr": 24.0,
        "elapsed_s": 9.0,
        "eta_s": 0,
    },
    # the summary service/intake/nerf.py records for an upload
    "dataset": {
        "filename": "scene.zip",
        "source_format": "blender",
        "n_train": 8,
        "n_test": 2,
        "n_val": 0,
        "sizes": [f"{W}x{H}"],
        "has_alpha": True,
        "normalization": {"scale": SCALE, "offset": CENTER},
    },
}


def png(width: int, height: int, output: str) -> bytes:
    colour = {"rgb": (200, 80, 40), "depth": (90, 90, 90), "alpha": (255, 255, 255)}[output]
    buf = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buf, "PNG")
    return buf.getvalue()


def webp_animation(width: int, height: int, n: int) -> bytes:
    frames = [
        Image.new("RGB", (width, height), (i * 255 // max(1, n - 1), 60, 120)) for i in range(n)
    ]
    buf = io.BytesIO()
    frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], duration=60, loop=0)
    return buf.getvalue()


SUCCEEDED_STREAM = (
    f"id: 1\nevent: status\ndata: {json.dumps({'status': 'succeeded'})}\n\n"
    f"event: end\ndata: {json.dumps(JOB)}\n\n"
)


@contextmanager
def viewer_session(
    stack_factory, job: dict, stream: str, camera_path: dict | None = None, step: int = 100
):
    """The real page against an API-only stack; the job's routes answered by interception.
    Renders answer with X-Checkpoint-Step: `step`, the newest checkpoint when they are asked."""
    api_only = stack_factory(queues=None)  # the page and the job list are real; no worker needed
    renders: list[dict] = []
    paths: list[dict] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        ctx = browser.new_context(
            viewport={"width": 1280, "height": 1000}, base_url=api_only.base_url
        )
        ctx.add_init_script(KEY_INIT)
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        base = f"**/v1/jobs/{job['id']}"
        page.route(base, lambda route: route.fulfill(json=job))
        page.route(
            base + "/events*",
            lambda route: route.fulfill(body=stream, content_type="text/event-stream"),
        )

        def on_render(route):
            body = json.loads(route.request.post_data)
            body["t"] = time.monotonic()
            renders.append(body)
            route.fulfill(
                body=png(body["width"], body["height"], body.get("output", "rgb")),
                content_type="image/png",
                headers={"X-Checkpoint-Step": str(step)},
            )

        def on_path(route):
            body = json.loads(route.request.post_data)
            paths.append(body)
            route.fulfill(
                body=webp_animation(body["width"], body["height"], 6), content_type="image/webp"
            )

        page.route(base + "/render", on_render)
        page.route(base + "/render/path", on_path)
        page.route(
            base + "/checkpoint",
            lambda route: route.fulfill(body=b"\0" * 64, content_type="application/octet-stream"),
        )
        if camera_path is not None:
            page.route(base + "/camera_path", lambda route: route.fulfill(json=camera_path))
        try:
            yield page, renders, paths, errors
        finally:
            ctx.close()
            browser.close()


@pytest.fixture
def viewer_page(stack_factory):
    with viewer_session(stack_factory, JOB, SUCCEEDED_STREAM) as session:
        yield session


def eye_of(req: dict) -> list[float]:
    return req["camera"]["look_at"]["eye"]


def dist(a, b) -> float:
    return math.dist(a, b)


def wait_still(page, renders, width: int, timeout: float = 10.0) -> dict:
    """Wait until the page has asked for a full-size frame after the last interaction."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page.wait_for_timeout(100)
        if renders and renders[-1]["width"] == width:
            page.wait_for_timeout(400)  # and nothing more comes after it
            if renders[-1]["width"] == width:
                return renders[-1]
    raise AssertionError(f"no full-size render; got {[r['width'] for r in renders]}")


def test_orbit_viewer_requests(viewer_page):
    page, renders, paths, errors = viewer_page
    page.goto(f"/#job={JOB_ID}")
    page.wait_for_selector("#d-status.succeeded")
    page.wait_for_function(
        "() => { const f = document.querySelector('#frame');"
        " return f && f.complete && f.naturalWidth > 0; }"
    )

    first = wait_still(page, renders, W)
    # a view nobody moved is asked for at full size at once: no small frames before it
    assert all(r["width"] == W for r in renders), [r["width"] for r in renders]
    assert (first["width"], first["height"], first["output"]) == (W, H, "rgb")
    look = first["camera"]["look_at"]
    assert look["target"] == CENTER and look["up"] == [0, 0, 1]
    assert dist(look["eye"], CENTER) == pytest.approx(3 / SCALE)  # outside the unit box
    assert 0 < first["fov_x_deg"] < 180

    # Drag: small frames while moving, then one full frame from the new viewpoint.
    box = page.locator(".stage").bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    n_before = len(renders)
    page.mouse.move(cx, cy)
    page.mouse.down()
    for i in range(1, 16):
        page.mouse.move(cx + 8 * i, cy + 2 * i)
        page.wait_for_timeout(40)
    page.mouse.up()
    moved = renders[n_before:]
    assert any(r["width"] == W // 4 and r["height"] == round(H / 4) for r in moved), [
        r["width"] for r in moved
    ]
    still = wait_still(page, renders, W)
    assert dist(eye_of(still), eye_of(first)) > 0.5
    assert dist(eye_of(still), CENTER) == pytest.approx(3 / SCALE)  # orbiting keeps the distance

    # Scroll down zooms out.
    page.mouse.move(cx, cy)
    page.mouse.wheel(0, 400)
    zoomed = wait_still(page, renders, W)
    assert dist(eye_of(zoomed), CENTER) > dist(eye_of(still), CENTER) * 1.2

    # The keyboard orbits as well.
    page.focus(".stage")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    keyed = wait_still(page, renders, W)
    assert dist(eye_of(keyed), eye_of(zoomed)) > 0.1
    assert dist(eye_of(keyed), CENTER) == pytest.approx(dist(eye_of(zoomed), CENTER))
    zoomed = keyed

    # Depth toggle asks for depth at full size and shows it.
    page.check("input[name=output][value=depth]")
    depth = wait_still(page, renders, W)
    assert depth["output"] == "depth" and eye_of(depth) == eye_of(zoomed)
    page.wait_for_function("() => document.querySelector('#hud').textContent.startsWith('depth')")

    # Checkpoint download is offered when the server has it.
    assert page.get_attribute("#d-checkpoint", "href") == f"/v1/jobs/{JOB_ID}/checkpoint"
    assert page.is_visible("#d-checkpoint")

    # Orbit animation around the current target, at the current distance.
    page.click("#orbit-animation")
    page.wait_for_selector(".animation img[alt='orbit animation']")
    assert len(paths) == 1
    orbit = paths[0]["orbit"]
    assert orbit["center"] == CENTER and orbit["n_frames"] > 1
    assert orbit["radius"] == pytest.approx(dist(eye_of(zoomed), CENTER))
    assert paths[0]["format"] == "webp"
    page.wait_for_selector(".animation a[download$='.webp']")

    # Every request the page made is one the real API accepts.
    for body in renders:
        RenderRequest.model_validate({k: v for k, v in body.items() if k != "t"})
    PathRequest.model_validate(paths[0])

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web_orbit_viewer.png"), full_page=True)
    assert errors == []


def test_a_running_scene_job_previews_and_refreshes_as_checkpoints_land(stack_factory):
    """Progress events announce checkpoints; the viewer appears while the job runs, re-renders
    when a newer one lands, shows the step it drew, and offers the training cameras."""
    job = {
        **JOB,
        "status": "running",
        "metrics": {},
        "progress": {**JOB["progress"], "step": 40, "checkpoint_step": 20},
    }
    events = [("status", {"status": "running"})] + [
        ("progress", {**job["progress"], "step": s, "checkpoint_step": c})
        for s, c in ((25, 20), (30, 20), (40, 40))
    ]
    stream = "".join(
        f"id: {i + 1}\nevent: {name}\ndata: {json.dumps(data)}\n\n"
        for i, (name, data) in enumerate(events)
    )
    cameras = {"camera_path": [], "render_width": W, "render_height": H, "frame": "world"}
    with viewer_session(stack_factory, job, stream, camera_path=cameras, step=40) as session:
        page, renders, _, errors = session
        page.goto(f"/#job={JOB_ID}")
        page.wait_for_selector("#d-status.running")
        wait_still(page, renders, W)
        page.wait_for_function(
            "() => document.querySelector('#hud').textContent.includes('step 40')"
        )
        # one frame for the first checkpoint seen, one more for the checkpoint that landed after;
        # nothing was dragged, so no small frames, however soon after page load the viewer came
        assert [r["width"] for r in renders] == [W, W]
        with page.expect_download() as download:
            page.click("#training-cameras")
        assert download.value.suggested_filename == f"{JOB_ID}-camera_path.json"
        assert json.loads(Path(download.value.path()).read_text()) == cameras
        assert not errors, errors
