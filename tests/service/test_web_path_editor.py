"""The page's camera path editor in headless Chromium against the real stack: a small nerf job
trains, three keyframes are taken by moving the view, reordered and deleted, timed and given a
field of view, previewed in the viewer, rendered as an MP4 by a path job (its progress shown,
the MP4 offered for download, decoded here with PyAV), and the path exported and imported
back as nerfstudio's camera_path.json. Screenshots go to test-artifacts/."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from api_schemas.render import PathRequest
from tests.service.test_web import ARTIFACTS, CHROMIUM, FLAGS, KEY_INIT, sync_api  # noqa: F401  (skips like test_web)
from tests.support.scenes import decode, scene_upload, train_scene

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

SIZE = 32
CONFIG = {
    "steps": 150,
    "samples_per_step": 8192,
    "max_rays_per_step": 2048,
    "log2_hashmap_size": 14,
    "n_levels": 10,
    "max_resolution": 256,
    "occupancy_resolution": 32,
    "max_samples_per_ray": 128,
    "checkpoint_every": 150,
    "n_test_renders": 0,
}
SECONDS, FPS = 1, 8
N_FRAMES = SECONDS * FPS
EDITOR = "document.querySelector('#path-editor').nfPaths"


@pytest.fixture(scope="module")
def trained(fs_stack):
    return train_scene(fs_stack, scene_upload(SIZE, 12, 1), "nerf", CONFIG)


def read_video(data: bytes) -> list[np.ndarray]:
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        return [f.to_ndarray(format="rgb24") for f in container.decode(stream)]


def keys(page) -> list[dict]:
    return page.evaluate(f"() => {EDITOR}.keys")


def set_value(page, selector: str, value) -> None:
    page.fill(selector, str(value))
    page.dispatch_event(selector, "change")


def download(page, selector: str) -> Path:
    with page.expect_download() as dl:
        page.click(selector)
    return Path(dl.value.path())


def test_the_path_editor_renders_an_mp4_and_round_trips_camera_path_json(
    fs_stack, trained, tmp_path
):
    job_id = trained["id"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        ctx = browser.new_context(
            viewport={"width": 1280, "height": 1100}, base_url=fs_stack.base_url
        )
        ctx.add_init_script(KEY_INIT)
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        renders: list[dict] = []
        page.on(
            "request",
            lambda r: (
                renders.append(json.loads(r.post_data))
                if r.method == "POST" and r.url.endswith("/render")
                else None
            ),
        )
        try:
            page.goto(f"/#job={job_id}")
            page.wait_for_selector("#d-status.succeeded", timeout=30_000)
            page.wait_for_function(
                "() => { const f = document.querySelector('#frame');"
                " return f && f.complete && f.naturalWidth > 0; }",
                timeout=30_000,
            )
            assert page.is_disabled("#path-render") and page.is_disabled("#path-preview")

            # three keyframes, the view moved (arrow keys orbit, '-' zooms out) between them
            page.click("#path-add")
            for moves in (["ArrowLeft"] * 4, ["ArrowLeft"] * 4 + ["ArrowUp", "-"]):
                page.focus(".stage")
                for key in moves:
                    page.keyboard.press(key)
                page.click("#path-add")
            page.wait_for_selector("#path-keyframes li:nth-child(3)")
            ks = keys(page)
            eyes = [np.asarray(k["c2w"])[:3, 3] for k in ks]
            assert len(ks) == 3
            assert (
                min(np.linalg.norm(a - b) for a, b in ((eyes[0], eyes[1]), (eyes[1], eyes[2])))
                > 0.3
            )

            # reorder and delete: a fourth keyframe moved to the front, then deleted
            page.keyboard.press("ArrowRight")
            page.click("#path-add")
            fourth = keys(page)[3]
            for i in (3, 2, 1):
                page.click(f"#path-keyframes li:nth-child({i + 1}) .kf-up")
            assert keys(page)[0] == fourth and keys(page)[1:] == ks
            page.click("#path-keyframes li:nth-child(1) .kf-down")
            assert keys(page)[1] == fourth
            page.click("#path-keyframes li:nth-child(2) .kf-delete")
            assert keys(page) == ks

            # duration, frame rate, size and one keyframe's field of view
            set_value(page, "#path-seconds", SECONDS)
            set_value(page, "#path-fps", FPS)
            set_value(page, "#path-width", SIZE)
            set_value(page, "#path-height", SIZE)
            set_value(page, "#path-keyframes li:nth-child(2) .kf-fov", 35)
            ks = keys(page)
            assert ks[1]["fovX"] == 35
            assert f"{N_FRAMES} frames at {SIZE}×{SIZE}" in page.text_content("#path-msg")

            # preview: the viewer shows poses along the path (server-rendered small frames)
            before = len(renders)
            page.click("#path-preview")
            page.wait_for_selector("#path-msg[data-previewed]", timeout=60_000)
            shown = [r for r in renders[before:] if "c2w" in r.get("camera", {})]
            assert len(shown) == N_FRAMES
            np.testing.assert_allclose(shown[0]["camera"]["c2w"], ks[0]["c2w"], atol=1e-6)
            np.testing.assert_allclose(shown[-1]["camera"]["c2w"], ks[-1]["c2w"], atol=1e-6)
            assert shown[0]["fov_x_deg"] == pytest.approx(ks[0]["fovX"])

            # export: nerfstudio's camera_path.json, which the API itself takes
            exported = json.loads(download(page, "#path-export").read_text())
            assert (exported["render_width"], exported["render_height"]) == (SIZE, SIZE)
            assert exported["fps"] == FPS and exported["seconds"] == SECONDS
            assert len(exported["keyframes"]) == 3 and len(exported["camera_path"]) == N_FRAMES
            np.testing.assert_allclose(
                exported["camera_path"][0]["camera_to_world"],
                exported["keyframes"][0]["matrix"],
                atol=1e-9,
            )
            # a square frame: the vertical field of view is the horizontal one
            assert exported["keyframes"][1]["fov"] == pytest.approx(35)
            PathRequest.model_validate({**exported, "format": "mp4"})
            (tmp_path / "camera_path.json").write_text(json.dumps(exported))
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "web_path_editor.png"), full_page=True)

            # render: a path job, its progress shown, the MP4 offered
            page.click("#path-render")
            page.wait_for_selector("#path-msg[data-render-id]", timeout=30_000)
            link = page.wait_for_selector("#path-download", timeout=90_000)
            assert "path job" not in page.text_content("#path-msg")
            render_id = page.get_attribute("#path-msg", "data-render-id")
            state = fs_stack.client.get(f"/v1/jobs/{job_id}/renders/{render_id}").json()
            assert state["status"] == "succeeded", state
            assert state["kind"] == "path" and state["format"] == "mp4"
            assert state["n_frames"] == N_FRAMES and state["frames_done"] == N_FRAMES
            assert page.evaluate("() => document.querySelector('#path-bar').style.width") == "100%"
            page.screenshot(path=str(ARTIFACTS / "web_path_editor_rendered.png"), full_page=True)
            with page.expect_download() as dl:
                link.click()
            frames = read_video(Path(dl.value.path()).read_bytes())
            assert len(frames) == N_FRAMES and frames[0].shape == (SIZE, SIZE, 3)

            # the MP4's ends are the end keyframes, as the render route draws them
            def server(k):
                body = {
                    "width": SIZE,
                    "height": SIZE,
                    "camera": {"c2w": k["c2w"]},
                    "fov_x_deg": k["fovX"],
                }
                r = fs_stack.client.post(f"/v1/jobs/{job_id}/render", json=body)
                assert r.status_code == 200, r.text
                return np.asarray(decode(r.content).convert("RGB"), dtype=np.float64)

            first, last = server(ks[0]), server(ks[-1])
            err = lambda a, b: float(np.abs(a.astype(np.float64) - b).mean())  # noqa: E731
            assert err(frames[0], first) < 8 and err(frames[-1], last) < 8
            assert err(frames[0], first) < err(frames[0], last)

            # import: the editor emptied, the file read back, the same path exported again
            for _ in range(3):
                page.click("#path-keyframes li:nth-child(1) .kf-delete")
            assert keys(page) == [] and page.is_disabled("#path-render")
            page.set_input_files("#path-import", str(tmp_path / "camera_path.json"))
            page.wait_for_selector("#path-keyframes li:nth-child(3)")
            assert "imported camera_path.json" in page.text_content("#path-msg")
            again = json.loads(download(page, "#path-export").read_text())
            assert again.keys() == exported.keys()
            for key in ("render_width", "render_height", "fps", "seconds", "camera_type", "frame"):
                assert again[key] == exported[key], key
            for a, b in zip(again["keyframes"], exported["keyframes"], strict=True):
                np.testing.assert_allclose(a["matrix"], b["matrix"], atol=1e-9)
                assert a["fov"] == pytest.approx(b["fov"]) and a["aspect"] == b["aspect"]
            for a, b in zip(again["camera_path"], exported["camera_path"], strict=True):
                np.testing.assert_allclose(a["camera_to_world"], b["camera_to_world"], atol=1e-9)
                assert a["fov"] == pytest.approx(b["fov"])
            assert errors == []
        finally:
            ctx.close()
            browser.close()
