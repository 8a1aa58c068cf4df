"""How fast the web page's splat viewer (service/static/js/splat_viewer.js) draws, in headless
Chromium: random Gaussians in the `.splat` layout, N of them, drawn from 30 poses around an
orbit; each frame is the depth sort, the upload of the order and the draw, timed until the GPU
(here SwiftShader, Chromium's CPU implementation of WebGL) has finished it.

    python -m experiments.splat_viewer_bench [--n 10000 100000 300000] [--size 512]

Prints one row per N: the median and 90th-percentile milliseconds per frame and frames per
second. Nothing is fetched from outside: Playwright answers the page's requests from
service/static/."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np

STATIC = Path(__file__).resolve().parents[1] / "service" / "static"
ORIGIN = "http://bench.invalid"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]

PAGE = """<!doctype html><canvas id="c"></canvas><script type="module">
import { parseSplat, SplatRenderer, lookAt } from "/static/js/splat_viewer.js";
const data = await (await fetch("/bench.splat")).arrayBuffer();
const t0 = performance.now();
const parsed = parseSplat(data);
const parseMs = performance.now() - t0;
const canvas = document.getElementById("c");
const r = new SplatRenderer(canvas);
r.setData(parsed);
const size = SIZE;
const fx = 0.5 * size / Math.tan(20 * Math.PI / 180);
const times = [], sorts = [];
const px = new Uint8Array(4);
for (let i = 0; i < 31; i++) {
  const a = i * 2 * Math.PI / 30;
  const c2w = lookAt([3 * Math.cos(a), 3 * Math.sin(a), 1.2], [0, 0, 0], [0, 0, 1]);
  const s = performance.now();
  r.draw({ c2w, fx, fy: fx, cx: size / 2, cy: size / 2, width: size, height: size, background: [1, 1, 1] });
  r.gl.readPixels(0, 0, 1, 1, r.gl.RGBA, r.gl.UNSIGNED_BYTE, px);  // waits for the frame
  if (i > 0) { times.push(performance.now() - s); sorts.push(r.sortMs); }  // frame 0 compiles
}
window.result = { parseMs, times, sorts };
</script>"""


def random_splat(n: int, spread: float = 1.0, seed: int = 0) -> bytes:
    from worker.exports.splat_files import SPLAT_DTYPE

    rng = np.random.default_rng(seed)
    out = np.zeros(n, SPLAT_DTYPE)
    d = rng.normal(size=(n, 3))
    out["position"] = d / np.linalg.norm(d, axis=1, keepdims=True) * rng.uniform(0, 1, (n, 1))
    out["scale"] = np.exp(rng.normal(np.log(spread * 0.6 / n ** (1 / 3)), 0.5, (n, 3)))
    out["rgba"] = rng.integers(0, 256, (n, 4))
    q = rng.normal(size=(n, 4))
    out["rot"] = np.clip(q / np.linalg.norm(q, axis=1, keepdims=True) * 128 + 128, 0, 255)
    return out.tobytes()


def run(ns: list[int], size: int, spread: float = 1.0) -> list[dict]:
    from playwright.sync_api import sync_playwright

    rows = []
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=FLAGS)
        for n in ns:
            blob = random_splat(n, spread)
            page = browser.new_page()

            def answer(route, request, blob=blob):
                path = request.url[len(ORIGIN) :]
                if path == "/":
                    route.fulfill(body=PAGE.replace("SIZE", str(size)), content_type="text/html")
                elif path == "/bench.splat":
                    route.fulfill(body=blob, content_type="application/octet-stream")
                elif path.startswith("/static/") and (STATIC / path[8:]).is_file():
                    route.fulfill(path=str(STATIC / path[8:]), content_type="text/javascript")
                else:
                    route.fulfill(status=404, body="")

            page.route("**/*", answer)
            page.goto(ORIGIN + "/")
            page.wait_for_function("() => window.result", timeout=600_000)
            res = page.evaluate("() => window.result")
            t = np.asarray(res["times"])
            rows.append(
                {
                    "n": n,
                    "parse_ms": res["parseMs"],
                    "median_ms": float(np.median(t)),
                    "p90_ms": float(np.percentile(t, 90)),
                    "sort_ms": float(np.median(res["sorts"])),
                }
            )
            page.close()
        browser.close()
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[10_000, 100_000, 300_000])
    ap.add_argument("--size", type=int, default=512, help="frame width and height in pixels")
    ap.add_argument(
        "--spread", type=float, default=1.0, help="Gaussian size relative to the mean spacing"
    )
    args = ap.parse_args(argv)
    print(
        f"{'gaussians':>10} {'parse ms':>9} {'median ms/frame':>16} {'p90 ms':>8} "
        f"{'of it sort ms':>14} {'fps':>6}"
    )
    for r in run(args.n, args.size, args.spread):
        print(
            f"{r['n']:>10} {r['parse_ms']:>9.0f} {r['median_ms']:>16.1f} {r['p90_ms']:>8.1f} "
            f"{r['sort_ms']:>14.1f} {1000 / r['median_ms']:>6.1f}"
        )


if __name__ == "__main__":
    main()
