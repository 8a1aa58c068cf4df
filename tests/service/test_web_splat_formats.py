"""The page's parsers of the splat files (service/static/js/splat_viewer.js: parseSpz for versions
4 and 3, parseSog, parseCompressedPly, parseGlb), in headless Chromium, on files the worker's
writers made from known Gaussians: the centres (in the job's world frame), colours, opacities and
the antialiasing flag the viewer draws agree with the Gaussians within each format's
quantisation. (tests/service/test_web_splat.py draws them from a trained job's exports.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.support.stack import REPO
from tests.worker.test_exports_spz import gaussians
from worker.exports.compressed_ply import compressed_ply_bytes
from worker.exports.gltf_splat import glb_bytes
from worker.exports.sog import sog_bytes
from worker.exports.spz import spz_bytes

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
scipy_spatial = pytest.importorskip("scipy.spatial")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip("no chromium binary (scripts/system_deps.sh installs it)", allow_module_level=True)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
ORIGIN = "http://formats.invalid"
STATIC = REPO / "service" / "static"
SH_C0 = 0.28209479177387814
N, NORM = 400, {"scale": 0.25, "offset": [10.0, -3.0, 2.0]}
PAGE = """<!doctype html><script type="module">
import { PARSERS } from "/static/js/splat_viewer.js";
const out = {};
for (const [name, format] of NAMES) {
  try {
    const data = await (await fetch("/files/" + name)).arrayBuffer();
    const got = await PARSERS[format](data);
    out[name] = { n: got.n, pos: Array.from(got.pos), rgba: Array.from(got.rgba),
                  antialiased: got.antialiased };
  } catch (err) {
    out[name] = { error: String(err && err.stack || err) };
  }
}
window.result = out;
</script>"""


def test_the_page_parses_every_splat_file():
    p = gaussians(N)
    files = {
        "v4.spz": ("spz", spz_bytes(p, NORM, antialiased=True)[0]),
        "v3.spz": ("spz", spz_bytes(p, NORM, antialiased=True, version=3)[0]),
        "scene.sog": ("sog", sog_bytes(p, NORM, antialiased=True)[0]),
        "scene.compressed.ply": ("compressed_ply", compressed_ply_bytes(p, NORM, True)[0]),
        "scene.glb": ("glb", glb_bytes(p, NORM, antialiased=True)[0]),
    }
    names = [[name, fmt] for name, (fmt, _) in files.items()]
    page_html = PAGE.replace("NAMES", repr(names))
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page()

            def answer(route, request):
                path = request.url[len(ORIGIN) :]
                if path == "/":
                    route.fulfill(body=page_html, content_type="text/html")
                elif path.startswith("/files/") and path[7:] in files:
                    route.fulfill(body=files[path[7:]][1], content_type="application/octet-stream")
                elif path.startswith("/static/") and (STATIC / path[8:]).is_file():
                    route.fulfill(path=str(STATIC / path[8:]), content_type="text/javascript")
                else:
                    route.fulfill(status=404, body="")

            page.route("**/*", answer)
            page.goto(ORIGIN + "/")
            page.wait_for_function("() => window.result", timeout=120_000)
            result = page.evaluate("() => window.result")
        finally:
            browser.close()

    means = p["means"].double().numpy() / NORM["scale"] + np.array(NORM["offset"])
    opacity = 1 / (1 + np.exp(-p["opacities"].double().numpy()))
    rgb = np.clip(SH_C0 * p["sh_dc"].double().numpy() + 0.5, 0, 1)
    extent = float(np.ptp(means, 0).max())
    # (position tolerance, colour and alpha tolerance in bytes); does the format reorder?
    tolerances = {
        "v4.spz": (2 / 4096, 2, False),
        "v3.spz": (2 / 4096, 2, False),
        "scene.sog": (2e-3 * extent, 3, True),  # 16 bits of log1p; 256-entry colour codebook
        "scene.compressed.ply": (extent / 1023, 2, True),  # 11/10/11 bits, 8-bit colours
        "scene.glb": (1e-5, 1, False),
    }
    for name, got in result.items():
        assert "error" not in got, f"{name}: {got.get('error')}"
        assert got["n"] == N and got["antialiased"] is True, name
        pos = np.reshape(got["pos"], (-1, 3))
        packed = np.asarray(got["rgba"], np.uint64)
        bytes_ = np.stack([(packed >> np.uint64(8 * k)) & np.uint64(255) for k in range(4)], 1)
        pos_tol, byte_tol, reorders = tolerances[name]
        idx = np.arange(N)
        if reorders:
            dist, idx = scipy_spatial.cKDTree(means).query(pos)
            assert sorted(idx) == list(range(N)), name
        assert np.abs(pos - means[idx]).max() <= pos_tol, name
        want = np.concatenate([rgb, opacity[:, None]], 1)[idx] * 255
        assert np.abs(bytes_.astype(np.float64) - want).max() <= byte_tol + 0.5, name
