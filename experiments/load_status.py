"""50 clients poll job status and request renders while a job trains (loopback only, bounded).

    python -m experiments.load_status                    # 50 clients, 20 s
    python -m experiments.load_status --clients 50 --seconds 20 --render-every 5

Starts its own API, a train worker and a render worker (tests/support/stack.py, a temp
DATA_DIR), trains a small job to render from, then starts a long training and lets the
clients loose: each loops GET /v1/jobs/<training job> and, every --render-every requests,
POST /render on the finished job. Prints request counts, every non-2xx answer, status and
render latency percentiles, and the training's steps/s before and during the load.
The render rate limit is raised for the run (RENDER_PIXELS_PER_MIN), since one key sends it all.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def run(clients: int, seconds: float, render_every: int, out=print) -> dict:
    sys.path.insert(0, str(REPO))

    from tests.support.stack import new_stack, png_bytes

    with tempfile.TemporaryDirectory(prefix="nf-load-") as tmp:
        stack = new_stack(
            Path(tmp),
            queues=None,
            redis_db=None,
            env={
                "BROKER_POLLING_INTERVAL_S": "0.05",
                "RENDER_PIXELS_PER_MIN": "1e12",
                "RENDER_PIXEL_BURST": "1e12",
            },
        )
        try:
            stack.start_worker("train")
            stack.start_worker("render")
            done_job = stack.submit(
                png_bytes(32, 24), config={"steps": 100, "resolution": 24}
            ).json()["id"]
            stack.wait_status(done_job, "succeeded")
            train_job = stack.submit(
                png_bytes(48, 32), config={"steps": 200000, "resolution": 32}
            ).json()["id"]
            stack.wait_for(
                train_job, lambda j: j["status"] == "running" and j["progress"]["step"] > 0, 60
            )
            s0, t0 = (
                stack.client.get(f"/v1/jobs/{train_job}").json()["progress"]["step"],
                time.monotonic(),
            )
            time.sleep(3)
            s1, t1 = (
                stack.client.get(f"/v1/jobs/{train_job}").json()["progress"]["step"],
                time.monotonic(),
            )
            quiet_rate = (s1 - s0) / (t1 - t0)

            lock = threading.Lock()
            status_ms: list[float] = []
            render_ms: list[float] = []
            errors: list[str] = []
            stop_at = time.monotonic() + seconds

            def client(i: int) -> None:
                with httpx.Client(
                    base_url=stack.base_url, headers=stack.headers, timeout=60
                ) as http:
                    n = 0
                    while time.monotonic() < stop_at:
                        n += 1
                        render = n % render_every == 0
                        t = time.perf_counter()
                        try:
                            if render:
                                r = http.post(
                                    f"/v1/jobs/{done_job}/render",
                                    json={"width": 32 + i % 8, "height": 24},
                                )
                            else:
                                r = http.get(f"/v1/jobs/{train_job}")
                        except httpx.HTTPError as exc:
                            with lock:
                                errors.append(f"client {i}: {exc!r}")
                            continue
                        ms = (time.perf_counter() - t) * 1000
                        with lock:
                            (render_ms if render else status_ms).append(ms)
                            if r.status_code >= 300:
                                errors.append(
                                    f"client {i}: {r.request.method} {r.request.url.path} -> "
                                    f"{r.status_code} {r.text[:120]}"
                                )

            l0 = stack.client.get(f"/v1/jobs/{train_job}").json()["progress"]["step"]
            lt0 = time.monotonic()
            threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            l1 = stack.client.get(f"/v1/jobs/{train_job}").json()["progress"]["step"]
            load_rate = (l1 - l0) / (time.monotonic() - lt0)
            stack.client.post(f"/v1/jobs/{train_job}/cancel")
        finally:
            stack.stop()

    res = {
        "clients": clients,
        "seconds": seconds,
        "status_requests": len(status_ms),
        "render_requests": len(render_ms),
        "errors": len(errors),
        "status_ms": {q: round(pct(status_ms, q), 1) for q in (50, 95, 99)},
        "render_ms": {q: round(pct(render_ms, q), 1) for q in (50, 95, 99)},
        "train_steps_per_s_quiet": round(quiet_rate, 1),
        "train_steps_per_s_loaded": round(load_rate, 1),
    }
    out(
        f"{clients} clients for {seconds:g} s on loopback: {len(status_ms)} status polls "
        f"({len(status_ms) / seconds:.0f}/s), {len(render_ms)} renders, {len(errors)} errors"
    )
    out(
        f"status latency ms: p50 {res['status_ms'][50]}, p95 {res['status_ms'][95]}, p99 {res['status_ms'][99]}"
        f" (max {max(status_ms, default=float('nan')):.1f})"
    )
    out(
        f"render latency ms: p50 {res['render_ms'][50]}, p95 {res['render_ms'][95]}, p99 {res['render_ms'][99]}"
        + (f" (mean {statistics.mean(render_ms):.1f})" if render_ms else "")
    )
    out(
        f"training steps/s: {quiet_rate:.1f} quiet vs {load_rate:.1f} under load "
        f"(ratio {load_rate / quiet_rate if quiet_rate else float('nan'):.2f})"
    )
    for e in errors[:20]:
        out("  error:", e)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--clients", type=int, default=50)
    p.add_argument(
        "--seconds", type=float, default=20.0, help="how long the clients run (bounded: max 120)"
    )
    p.add_argument("--render-every", type=int, default=5, help="one render per this many requests")
    args = p.parse_args(argv)
    res = run(min(args.clients, 200), min(args.seconds, 120.0), max(1, args.render_every))
    return 0 if res["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
