"""Sizes and load times of a splat job's files: the 3DGS PLY, `.splat` and `.spz`, for N
Gaussians of SH degree 3 (random, with trained-like statistics: small view-dependent bands, log
scales around a hundredth of the scene), or of a job's checkpoint (`--checkpoint`).

    python -m experiments.splat_formats [--n 25000 100000 300000] [--checkpoint ckpt.safetensors]

Prints per N: bytes of each file, seconds to write it on this CPU (Python), and milliseconds for
the web page's parser (service/static/js/splat_viewer.js: parseSplat, parseSpz with the
browser's DecompressionStream) to turn the downloaded bytes into what it draws, in headless
Chromium. Nothing is fetched from outside."""

from __future__ import annotations

import argparse
import shutil
import time

import torch

from experiments.splat_viewer_bench import FLAGS, ORIGIN, STATIC

PAGE = """<!doctype html><script type="module">
import { parseSplat, parseSpz } from "/static/js/splat_viewer.js";
const out = {};
for (const name of ["splat", "spz"]) {
  const data = await (await fetch("/bench." + name)).arrayBuffer();
  const times = [];
  for (let i = 0; i < 5; i++) {
    const t0 = performance.now();
    const parsed = name === "spz" ? await parseSpz(data.slice(0)) : parseSplat(data);
    times.push(performance.now() - t0);
    out[name + "_n"] = parsed.n;
  }
  times.sort((a, b) => a - b);
  out[name] = times[2];
}
window.result = out;
</script>"""


def trained_like(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(n, 3, generator=g)
    return {
        "means": d / d.norm(dim=1, keepdim=True) * torch.rand(n, 1, generator=g),
        "scales": torch.randn(n, 3, generator=g) * 0.7 - 4.6,
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.randn(n, generator=g) * 2,
        "sh_dc": torch.randn(n, 3, generator=g) * 0.8,
        "sh_rest": torch.randn(n, 15, 3, generator=g) * 0.05,
    }


def files(params) -> dict[str, tuple[bytes, float]]:
    from worker.exports.splat_files import splat_bytes
    from worker.exports.spz import spz_bytes
    from worker.splat.ply import ply_bytes

    out = {}
    for name, fn in (
        ("ply", lambda: ply_bytes(params)),
        ("splat", lambda: splat_bytes(params, None)[0]),
        ("spz", lambda: spz_bytes(params, None)[0]),
    ):
        t0 = time.perf_counter()
        data = fn()
        out[name] = (data, time.perf_counter() - t0)
    return out


def parse_ms(blobs: dict[str, bytes]) -> dict:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=FLAGS)
        page = browser.new_page()

        def answer(route, request):
            path = request.url[len(ORIGIN) :]
            if path == "/":
                route.fulfill(body=PAGE, content_type="text/html")
            elif path.startswith("/bench."):
                route.fulfill(body=blobs[path[7:]], content_type="application/octet-stream")
            elif path.startswith("/static/") and (STATIC / path[8:]).is_file():
                route.fulfill(path=str(STATIC / path[8:]), content_type="text/javascript")
            else:
                route.fulfill(status=404, body="")

        page.route("**/*", answer)
        page.goto(ORIGIN + "/")
        page.wait_for_function("() => window.result", timeout=600_000)
        res = page.evaluate("() => window.result")
        browser.close()
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[25_000, 100_000, 300_000])
    ap.add_argument("--checkpoint", help="a splat job's checkpoint (safetensors) instead")
    args = ap.parse_args(argv)
    models = []
    if args.checkpoint:
        from safetensors.torch import load_file

        t = load_file(args.checkpoint)
        models.append(
            {k: t[k] for k in ("means", "scales", "quats", "opacities", "sh_dc", "sh_rest")}
        )
    else:
        models = [trained_like(n) for n in args.n]
    print(
        "| Gaussians | PLY bytes | .splat bytes | .spz bytes | PLY / .spz | write s (ply / splat / spz) | page parse ms (.splat / .spz) |"
    )
    print("|---:|---:|---:|---:|---:|---|---|")
    for p in models:
        f = files(p)
        ms = parse_ms({k: f[k][0] for k in ("splat", "spz")})
        n = len(p["means"])
        assert ms["splat_n"] == ms["spz_n"] == n
        sizes = {k: len(v[0]) for k, v in f.items()}
        print(
            f"| {n} | {sizes['ply']:,} | {sizes['splat']:,} | {sizes['spz']:,} | "
            f"{sizes['ply'] / sizes['spz']:.1f}x | "
            f"{f['ply'][1]:.2f} / {f['splat'][1]:.2f} / {f['spz'][1]:.2f} | "
            f"{ms['splat']:.0f} / {ms['spz']:.0f} |"
        )


if __name__ == "__main__":
    main()
