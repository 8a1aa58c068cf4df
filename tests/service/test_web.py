"""The web page in headless Chromium (Debian's package, driven by Playwright) against the real
stack: upload a photo, watch it train, see the rendered field. Screenshots go to
test-artifacts/ so a person can look at what the page showed."""

from __future__ import annotations

import base64
import io
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.stack import REPO, TEST_KEY, png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

# What the page's API key field stores (service/static/js/api.js), set before the page loads.
KEY_INIT = f"localStorage.setItem('nf.apiKey', {TEST_KEY!r})"

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = REPO / "test-artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install '.[dev]')"
)
if not Path(CHROMIUM).exists():
    pytest.skip(
        "no chromium binary (apt-get install chromium; scripts/system_deps.sh does it)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser, fs_stack):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=fs_stack.base_url)
    ctx.add_init_script(KEY_INIT)
    pg = ctx.new_page()
    pg.errors = []
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    try:
        yield pg
    finally:
        ctx.close()


def shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def test_upload_train_and_view(page, fs_stack, tmp_path):
    photo = tmp_path / "photo.png"
    photo.write_bytes(png_bytes(48, 36))
    page.goto("/")
    page.wait_for_selector("#health:has-text('service ready')")

    page.set_input_files("#dataset", str(photo))
    page.fill("#config", '{"steps": 500, "resolution": 32}')
    page.click("#submit")
    page.wait_for_selector("#upload-msg.ok")
    # The page selects the new job after the list refresh; the id shows once that is done.
    page.wait_for_function("() => document.querySelector('#d-id').textContent.trim().length > 0")
    job_id = page.text_content("#d-id").strip()
    job = fs_stack.client.get(f"/v1/jobs/{job_id}").json()
    assert job["config"]["steps"] == 500 and job["kind"] == "image"

    page.wait_for_selector(f"#jobs tr[data-id='{job_id}']")
    page.wait_for_selector("#d-status.succeeded", timeout=120_000)
    page.wait_for_selector(f"#jobs tr[data-id='{job_id}'] .badge.succeeded")
    # The list's refreshes update rows in place: a row rebuilt between a click's press and
    # release would swallow the click.
    row = f"document.querySelector(\"#jobs tr[data-id='{job_id}']\")"
    page.evaluate(f"() => {{ {row}.kept = true; }}")
    with page.expect_response(lambda r: "/v1/jobs?limit=" in r.url):  # the next refresh
        pass
    page.wait_for_timeout(100)
    assert page.evaluate(f"() => {row}.kept === true")
    assert "step 500 / 500" in page.text_content("#d-progress-text")
    done = fs_stack.client.get(f"/v1/jobs/{job_id}").json()
    assert f"psnr {done['metrics']['psnr']:.2f}" in page.text_content("#d-metrics")
    # The plot was fed by the event stream: several distinct steps arrived live or replayed.
    assert int(page.get_attribute("#plot", "data-points")) >= 3

    page.wait_for_function(
        "() => { const f = document.querySelector('#frame');"
        " return f && f.complete && f.naturalWidth > 0; }",
        timeout=60_000,
    )
    size = page.evaluate(
        "() => [document.querySelector('#frame').naturalWidth,"
        " document.querySelector('#frame').naturalHeight]"
    )
    assert size == [128, 96]  # the default choice: 4x the 32x24 training grid

    # What the page shows is what the render endpoint gives for that size.
    b64 = page.evaluate("""async () => {
        const blob = await (await fetch(document.querySelector('#frame').src)).blob();
        const buf = new Uint8Array(await blob.arrayBuffer());
        let s = ''; for (const b of buf) s += String.fromCharCode(b);
        return btoa(s);
    }""")
    shown = np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"), dtype=np.int16)
    direct = fs_stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": 128, "height": 96})
    want = np.asarray(Image.open(io.BytesIO(direct.content)).convert("RGB"), dtype=np.int16)
    assert np.abs(shown - want).max() <= 1 and want.std() > 10

    path = shot(page, "web_image_job_succeeded.png")
    assert path.stat().st_size > 10_000
    assert page.errors == []


def test_bad_upload_shows_the_servers_detail(page, fs_stack, tmp_path):
    bogus = tmp_path / "notes.png"
    bogus.write_text("this is not a picture")
    before = len(fs_stack.job_dirs())
    page.goto("/")
    page.set_input_files("#dataset", str(bogus))
    page.click("#submit")
    page.wait_for_selector("#upload-msg.error")
    msg = page.text_content("#upload-msg")
    assert msg.startswith("upload refused:") and len(msg) > len("upload refused: ") + 5
    assert len(fs_stack.job_dirs()) == before

    page.fill("#config", "{steps: 1")  # caught before anything is sent
    page.click("#submit")
    page.wait_for_selector("#upload-msg.error:has-text('not valid JSON')")
    shot(page, "web_bad_upload.png")
    assert page.errors == []


def test_cancel_from_the_page(page, fs_stack, tmp_path):
    photo = tmp_path / "photo.png"
    photo.write_bytes(png_bytes(48, 36, seed=3))
    page.goto("/")
    page.set_input_files("#dataset", str(photo))
    page.fill("#config", '{"steps": 200000, "resolution": 32}')
    page.click("#submit")
    page.wait_for_selector("#d-status.running", timeout=60_000)
    job_id = page.text_content("#d-id").strip()
    page.click("#d-cancel")
    page.wait_for_selector("#d-status.cancelled", timeout=30_000)
    assert fs_stack.client.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
    assert page.is_hidden("#d-cancel")
    assert page.errors == []
