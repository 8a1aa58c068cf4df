"""Train a nerf and a splat job through the real service, then render: scripts/gpu_check.sh's
training stage, also runnable on a CPU.

Starts `python -m service.embedded` (the API and a real Celery worker on every queue; the
filesystem broker under a temporary DATA_DIR, or Redis when REDIS_URL is set) with DEVICE set,
uploads a synthetic scene with exact ground truth over HTTP, trains each kind for --steps steps,
renders a held-out view through POST /render and scores it against the ground truth. One JSON line
on stdout as each stage ends (start, then per kind upload, train, render), so a run cut short
still reports what it reached; exits non-zero if any stage failed.

    python -m experiments.gpu_train_check                       # DEVICE=cuda, 200 steps
    python -m experiments.gpu_train_check --device cpu --steps 20 --size 32 --nerf-config '{"samples_per_step": 4096}'

train line: `steps`, `train_s` (the trainer's own clock), `steps_per_s`, `samples_per_s` (nerf:
the last step's rays/s x samples per ray, as progress reports them; splat: pixels rendered per
second of training, one training view per step), `test_psnr` (the job's held-out evaluation).
render line: the HTTP round trip of one held-out view and its PSNR against the exact image.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from experiments.nerf_quality import _on_white, _psnr
from experiments.synthetic_scene import FOV_X_DEG, scene_files

REPO = Path(__file__).resolve().parents[1]
TERMINAL = ("succeeded", "failed", "cancelled")


def emit(stage: str, **fields) -> None:
    print(json.dumps({"stage": stage, **fields}), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_service(data_dir: Path, port: int, token: str, device: str, log) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEYS", "API_KEYS_FILE")}
    env.update(
        DATA_DIR=str(data_dir),
        PORT=str(port),
        HOST="127.0.0.1",
        API_KEYS=f"gpucheck:{token}",
        DEVICE=device,
        # one checkpoint at the end is enough; renders wait for the finished job
        CHECKPOINT_INTERVAL_S=env.get("CHECKPOINT_INTERVAL_S", "600"),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "service.embedded"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its worker and pool processes go with the group at the end
    )


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def stop_service(proc: subprocess.Popen) -> None:
    # The launcher runs its worker in a session of its own: note it before the launcher goes.
    workers = _children(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # the launcher stops its worker, SIGKILL after 15 s
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pgid in [proc.pid, *workers]:  # whatever of either group is still there
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def wait_ready(client: httpx.Client, proc: subprocess.Popen, deadline: float) -> dict:
    last: dict = {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}")
        try:
            r = client.get("/readyz", timeout=2)
            last = r.json()
            if r.status_code == 200:
                return last
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"service not ready: {last}")


def wait_job(client: httpx.Client, job_id: str, deadline: float) -> dict:
    job: dict = {}
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job.get("status") in TERMINAL:
            return job
        time.sleep(0.5)
    return job


def train_stats(kind: str, job: dict, pixels_per_view: int) -> dict:
    metrics = job.get("metrics") or {}
    progress = job.get("progress") or {}
    steps = metrics.get("steps") or progress.get("step")
    train_s = metrics.get("train_s") or progress.get("elapsed_s")
    out = {
        "status": job.get("status"),
        "steps": steps,
        "train_s": train_s,
        "steps_per_s": round(steps / train_s, 2) if steps and train_s else None,
        "test_psnr": round(metrics["test_psnr"], 2) if metrics.get("test_psnr") else None,
        "error": job.get("error"),
    }
    if kind == "nerf":
        rays, per_ray = progress.get("rays_per_s"), progress.get("samples_per_ray")
        out["samples_per_s"] = round(rays * per_ray) if rays and per_ray else None
        out["rays_per_s"] = rays
        out["samples_per_ray"] = per_ray
    else:
        out["samples_per_s"] = (
            round(out["steps_per_s"] * pixels_per_view) if out["steps_per_s"] else None
        )
        out["n_gaussians"] = metrics.get("n_gaussians")
    return out


def run_kind(
    client: httpx.Client,
    kind: str,
    data: bytes,
    files: dict[str, bytes],
    size: int,
    config: dict,
    deadline: float,
) -> bool:
    t0 = time.monotonic()
    r = client.post(
        "/v1/jobs",
        data={"kind": kind, "config": json.dumps(config)},
        files={"dataset": ("scene.zip", data, "application/zip")},
    )
    ok = r.status_code == 202
    job_id = r.json().get("id") if ok else None
    emit(
        f"{kind}_upload",
        ok=ok,
        http=r.status_code,
        job=job_id,
        seconds=round(time.monotonic() - t0, 2),
        **({} if ok else {"detail": r.text[:500]}),
    )
    if not ok:
        return False
    t0 = time.monotonic()
    job = wait_job(client, job_id, deadline)
    stats = train_stats(kind, job, size * size)
    ok = job.get("status") == "succeeded"
    if job.get("status") not in TERMINAL:
        stats["timed_out"] = True
        client.post(f"/v1/jobs/{job_id}/cancel")  # the next kind gets the worker
    emit(f"{kind}_train", ok=ok, wall_s=round(time.monotonic() - t0, 1), **stats)
    if not ok:
        return False
    test = json.loads(files["transforms_test.json"])["frames"][0]
    t0 = time.monotonic()
    r = client.post(
        f"/v1/jobs/{job_id}/render",
        json={
            "width": size,
            "height": size,
            "fov_x_deg": FOV_X_DEG,
            "camera": {"c2w": test["transform_matrix"]},
        },
    )
    ms = round(1000 * (time.monotonic() - t0), 1)
    ok = r.status_code == 200 and r.headers.get("content-type", "").startswith("image/")
    fields: dict = {"http": r.status_code, "ms": ms, "pixels": size * size}
    if ok:
        img = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"), dtype=np.float64) / 255
        fields["psnr"] = round(_psnr(img, _on_white(files["test/r_0.png"])), 2)
    else:
        fields["detail"] = r.text[:500]
    emit(f"{kind}_render", ok=ok, **fields)
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda", help="DEVICE of the worker (cuda, cuda:1, cpu)")
    ap.add_argument("--steps", type=int, default=200, help="training steps of each job")
    ap.add_argument("--size", type=int, default=100, help="side of the synthetic views (pixels)")
    ap.add_argument("--views", type=int, default=30, help="training views (+5 held out)")
    ap.add_argument("--kinds", default="nerf,splat")
    ap.add_argument("--nerf-config", default="{}", help="JSON merged into the nerf job's config")
    ap.add_argument("--splat-config", default="{}", help="JSON merged into the splat job's config")
    ap.add_argument("--timeout", type=float, default=240, help="seconds for the whole check")
    ap.add_argument("--keep", action="store_true", help="keep DATA_DIR and the service log")
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.timeout

    def on_term(signum, frame):  # `timeout` sends SIGTERM: stop the service on the way out
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    work = Path(tempfile.mkdtemp(prefix="gpu-train-check-"))
    log_path = work / "service.log"
    token = secrets.token_hex(16)
    port = free_port()
    failed = False
    t0 = time.monotonic()
    files = scene_files(size=args.size, n_train=args.views, n_test=5)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, blob in files.items():
            zf.writestr(name, blob)
    data = buf.getvalue()
    scene_s = round(time.monotonic() - t0, 2)
    with open(log_path, "wb") as log:
        proc = start_service(work / "data", port, token, args.device, log)
        try:
            client = httpx.Client(
                base_url=f"http://127.0.0.1:{port}",
                headers={"Authorization": f"Bearer {token}"},
                timeout=120,
            )
            t0 = time.monotonic()
            ready = wait_ready(client, proc, min(deadline, time.monotonic() + 120))
            emit(
                "service",
                ok=True,
                device=args.device,
                broker="redis" if os.environ.get("REDIS_URL") else "filesystem",
                kinds=ready.get("kinds"),
                ready_s=round(time.monotonic() - t0, 1),
                scene_s=scene_s,
                size=args.size,
                views=args.views,
            )
            for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
                if time.monotonic() > deadline - 10:
                    emit(f"{kind}_upload", ok=False, skipped="no time left (--timeout)")
                    failed = True
                    continue
                config = {"steps": args.steps, **json.loads(getattr(args, f"{kind}_config"))}
                try:
                    ok = run_kind(client, kind, data, files, args.size, config, deadline)
                except (httpx.HTTPError, ValueError) as exc:
                    emit(f"{kind}_error", ok=False, error=f"{type(exc).__name__}: {exc}")
                    ok = False
                failed |= not ok
        except (RuntimeError, TimeoutError, httpx.HTTPError) as exc:
            emit("service", ok=False, error=f"{type(exc).__name__}: {exc}")
            failed = True
        finally:
            stop_service(proc)
    if failed:
        tail = log_path.read_text(errors="replace")[-6000:]
        print(f"--- service log ({log_path}) ---\n{tail}", file=sys.stderr)
    if not args.keep and not failed:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
