"""Splat jobs in the browser (headless Chromium, Debian's package, driven by Playwright): the page
fetches the job's `.spz` export (version 4, ZSTD) and draws it with WebGL2; its file menu draws
the SOG, compressed PLY and glb exports too. At a known pose its frame is compared
with the server's render of the same pose (the job is trained with the antialiasing filter, which
the file's flag carries to the page); orbiting redraws with no request to the server."""

from __future__ import annotations

import base64
import io
import math
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from experiments.synthetic_scene import Box, Scene, Sphere, look_at, scene_files
from tests.support.stack import REPO, TEST_KEY

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("no chromium binary (scripts/system_deps.sh installs it)", allow_module_level=True)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]  # fmt: skip
ARTIFACTS = REPO / "test-artifacts"

SIZE = 40
SCENE = Scene(
    [
        Sphere((-0.3, 0.1, 0.1), 0.45, ((0.9, 0.2, 0.15), (0.95, 0.8, 0.2)), (8, 4)),
        Box((0.35, -0.3, -0.1), (0.25, 0.22, 0.3), ((0.2, 0.7, 0.3), (0.1, 0.25, 0.1)), 30.0),
    ]
)
CONFIG = {
    "steps": 150,
    "n_init_points": 3000,
    "densify_from": 100,
    "n_test_renders": 0,
    "antialiased": True,
}
FOV = 40.0
# The browser draws the same Gaussians with the same projection and compositing rules; what
# differs is the file (8-bit colour, opacity and rotation; no view-dependent SH, which this short
# training has not started) and 8-bit blending in the framebuffer. Measured 41 dB over the frame
# and 36.5 dB over the scene's own pixels at 160x160; the same frame against the server's render
# from a camera turned by 5 degrees scores 29 dB.
MIN_PSNR_DB = 35.0
MIN_SCENE_PSNR_DB = 30.0


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * math.log10(255.0**2 / max(mse, 1e-12))


@pytest.fixture(scope="module")
def trained(fs_stack):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in scene_files(SIZE, 16, 1, seed=5, scene=SCENE).items():
            zf.writestr(name, data)
    r = fs_stack.submit(buf.getvalue(), "scene.zip", "splat", CONFIG, "application/zip")
    assert r.status_code == 202, r.text
    job = fs_stack.wait_status(r.json()["id"], "succeeded", "failed", timeout=240)
    assert job["status"] == "succeeded", f"{job['error']}\n{fs_stack.logs()}"
    return job


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


def canvas_pixels(page) -> np.ndarray:
    url = page.evaluate("() => document.querySelector('#splat-canvas').toDataURL('image/png')")
    data = base64.b64decode(url.split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_browser_draws_the_splats_like_the_server(browser, fs_stack, trained):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=fs_stack.base_url)
    ctx.add_init_script(f"localStorage.setItem('nf.apiKey', {TEST_KEY!r})")
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"/#job={trained['id']}")
        page.wait_for_selector("#splat-canvas[data-ready='1']", timeout=60_000)
        assert "Gaussians" in page.text_content("#splat-msg")

        # orbiting: frames are drawn in the page, nothing is asked of the server
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url) if "/render" in r.url else None)
        before = page.evaluate(
            "() => document.querySelector('#splat-canvas').nfViewer.renderer.frames"
        )
        box = page.locator("#splat-canvas").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        for i in range(20):
            page.mouse.move(box["x"] + box["width"] / 2 + 6 * (i + 1), box["y"] + box["height"] / 2)
            page.wait_for_timeout(20)
        page.mouse.up()
        page.wait_for_timeout(100)
        after = page.evaluate(
            "() => document.querySelector('#splat-canvas').nfViewer.renderer.frames"
        )
        assert after - before >= 5 and requests == []
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "web_splat_viewer.png"), full_page=True)

        # a known pose, drawn by the browser and rendered by the server, 4x the training size
        c2w = look_at(np.array([2.2, -2.4, 1.6])).tolist()
        side = 4 * SIZE
        page.evaluate(
            "([c2w, fov, side]) => document.querySelector('#splat-canvas').nfViewer"
            ".showPose(c2w, fov, side, side)",
            [c2w, FOV, side],
        )
        shown = canvas_pixels(page)
        assert shown.shape == (side, side, 3)

        def server(pose):
            r = fs_stack.client.post(
                f"/v1/jobs/{trained['id']}/render",
                json={
                    "width": side,
                    "height": side,
                    "camera": {"c2w": pose},
                    "fov_x_deg": FOV,
                    "background": "white",
                },  # fmt: skip
            )
            assert r.status_code == 200, r.text
            return np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"))

        same = server(c2w)
        Image.fromarray(np.concatenate([shown, same], 1)).save(
            ARTIFACTS / "web_splat_vs_server.png"
        )
        fg = (same < 250).any(-1)
        assert fg.mean() > 0.1  # the view shows the scene, not just background
        score, score_fg = psnr(shown, same), psnr(shown[fg], same[fg])
        # the same comparison with the camera turned 5 degrees: what a small pose error scores
        turned = server(
            look_at(np.array([2.2 * 0.996 + 2.4 * 0.087, -2.4 * 0.996 + 2.2 * 0.087, 1.6])).tolist()
        )
        print(f"browser vs server: {score:.2f} dB ({score_fg:.2f} dB on the scene's pixels); "
              f"vs a 5-degree turn {psnr(shown, turned):.2f} dB")  # fmt: skip
        assert score > MIN_PSNR_DB and score_fg > MIN_SCENE_PSNR_DB, (score, score_fg)
        assert score > psnr(shown, turned) + 5

        # the export panel: a point cloud made on the worker, downloaded with the page's key
        page.select_option("#export-format", "point_cloud")
        page.click("#export-go")
        link = page.wait_for_selector("#export-list a[data-format='point_cloud']", timeout=60_000)
        with page.expect_download() as dl:
            link.click()
        assert Path(dl.value.path()).read_bytes().startswith(b"ply")
        assert errors == []
    finally:
        ctx.close()


# The viewer's other files, drawn at the same pose as the .spz: each against the server's render.
# What limits them is their quantisation (SOG's 256-entry codebooks of scales and colours, the
# compressed PLY's 8-bit colours within each chunk's range; the glb is float) and the page's 8-bit
# blending. Measured 48.3 (sog), 49.5 (compressed_ply) and 49.5 dB (glb) at 160x160.
MIN_FILE_PSNR_DB = {"sog": 38.0, "compressed_ply": 40.0, "glb": 40.0}


def test_browser_draws_each_splat_file(browser, fs_stack, trained):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=fs_stack.base_url)
    ctx.add_init_script(f"localStorage.setItem('nf.apiKey', {TEST_KEY!r})")
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    side = 4 * SIZE
    c2w = look_at(np.array([2.2, -2.4, 1.6])).tolist()
    r = fs_stack.client.post(
        f"/v1/jobs/{trained['id']}/render",
        json={
            "width": side,
            "height": side,
            "camera": {"c2w": c2w},
            "fov_x_deg": FOV,
            "background": "white",
        },  # fmt: skip
    )
    assert r.status_code == 200, r.text
    same = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"))
    try:
        page.goto(f"/#job={trained['id']}")
        page.wait_for_selector("#splat-canvas[data-ready='1'][data-format='spz']", timeout=60_000)
        shown = {}
        for fmt in ("sog", "compressed_ply", "glb"):
            page.select_option("#splat-format", fmt)
            page.wait_for_selector(
                f"#splat-canvas[data-ready='1'][data-format='{fmt}']", timeout=120_000
            )
            n = page.evaluate("() => document.querySelector('#splat-canvas').nfViewer.renderer.n")
            assert n == trained["metrics"]["n_gaussians"], fmt
            assert page.evaluate(
                "() => document.querySelector('#splat-canvas').nfViewer.renderer.antialiased"
            ), fmt  # the flag travels in every file
            page.evaluate(
                "([c2w, fov, side]) => document.querySelector('#splat-canvas').nfViewer"
                ".showPose(c2w, fov, side, side)",
                [c2w, FOV, side],
            )
            shown[fmt] = canvas_pixels(page)
            score = psnr(shown[fmt], same)
            print(f"{fmt} in the browser vs the server: {score:.2f} dB")
            assert score > MIN_FILE_PSNR_DB[fmt], (fmt, score)
        ARTIFACTS.mkdir(exist_ok=True)
        Image.fromarray(np.concatenate([*shown.values(), same], 1)).save(
            ARTIFACTS / "web_splat_files_vs_server.png"
        )
        assert errors == []
    finally:
        ctx.close()
