"""Held-out quality on a capture-like scene (experiments/capture_scene.py: an object on a table in
a room, phone photos through a distorting lens), posed and unposed, kind nerf and kind splat,
through the real service with its default config and a time budget.

Prints one row per job: held-out PSNR/SSIM (the job's own metrics over its test split, every 8th
photo), the subject PSNR (those renders on the object's pixels only: nerf, posed and object
uploads), the last batch's train PSNR, steps, the box the dataset got, share of the budget that
was training steps, samples per ray (nerf), SfM seconds. `--artifacts` keeps each job's renders,
`--big-frame 1080x1920` times a photo-sized frame after the first posed nerf job. `--repo` runs the service of another checkout (e.g. a
`git worktree add /tmp/before f947d5a`), so the same script measures before and after:

    python -m experiments.capture_table --budget 300 [--repo /tmp/before] [--runs nerf:posed,...]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import tempfile
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from core.scene_format import TEST_EVERY
from experiments.capture_scene import (
    FOV_Y_DEG,
    arc_poses,
    capture_files,
    object_scene,
    phone_lens,
    render,
    zip_bytes,
)

RUNS = "nerf:posed,nerf:unposed,nerf:object,splat:posed,splat:unposed"
RENDERS = "test_renders.zip"  # worker/jobs/scene.py's RENDERS_ZIP (an experiment imports no worker)


def run_job(
    stack, kind: str, data: bytes, budget: float, timeout: float, extra: dict | None = None
) -> dict:
    t0 = time.monotonic()
    config = {**(extra or {}), "time_limit_s": budget}
    r = stack.submit(data, "capture.zip", kind=kind, config=config)
    r.raise_for_status()
    job_id = r.json()["id"]
    spr: list[float] = []
    deadline = time.monotonic() + timeout
    job = None
    while time.monotonic() < deadline:
        job = stack.client.get(f"/v1/jobs/{job_id}").json()
        p = job.get("progress") or {}
        if p.get("samples_per_ray") is not None:
            spr.append(float(p["samples_per_ray"]))
        if job["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(1.0)
    job["wall_s"] = time.monotonic() - t0
    job["samples_per_ray_seen"] = spr
    return job


def row(label: str, kind: str, upload: str, budget: float, job: dict) -> dict:
    m = job.get("metrics") or {}
    ds = job.get("dataset") or {}
    used = m.get("budget_used_s") or 0.0
    spr = job["samples_per_ray_seen"]
    return {
        "code": label,
        "kind": kind,
        "upload": upload,
        "budget_s": budget,
        "status": job["status"],
        "error": job.get("error"),
        "test_psnr": m.get("test_psnr"),
        "test_ssim": m.get("test_ssim"),
        "subject_psnr": None,
        "train_psnr": m.get("train_psnr"),
        "n_test": m.get("n_test"),
        "background_psnr": m.get("background_psnr"),
        "train_s": m.get("train_s"),
        "budget_used_s": used,
        "train_share": (m.get("train_s") or 0.0) / used if used else None,
        "steps": m.get("steps"),
        # the last quarter of the run's progress reports: where the grid has settled
        "samples_per_ray": sum(spr[-max(1, len(spr) // 4) :])
        / max(1, len(spr[-max(1, len(spr) // 4) :]))
        if spr
        else None,
        "aabb_scale": ds.get("aabb_scale"),
        "n_registered": ds.get("n_registered"),
        "sfm_s": ds.get("sfm_s"),
        "wall_s": round(job["wall_s"], 1),
    }


def reordered(photos: dict[str, bytes]) -> dict[str, bytes]:
    """The unposed photos renamed in reverse order (DSC_...): SfM starts from other pairs and
    picks another world frame, as a second upload of the same capture would. The reversal spans
    the first 8k + 1 photos, so the every-8th held-out split keeps the same photos and the two
    uploads are scored on the same views."""
    names = list(photos)
    span = TEST_EVERY * ((len(names) - 1) // TEST_EVERY) + 1
    order = list(reversed(range(span))) + list(range(span, len(names)))
    return {f"images/DSC_{k:04d}.jpg": photos[names[i]] for k, i in enumerate(order)}


def artifact(stack, job_id: str, name: str) -> bytes | None:
    r = stack.client.get(f"/v1/jobs/{job_id}/artifacts/{name}", follow_redirects=True)
    return r.content if r.status_code == 200 else None


def save_images(stack, job_id: str, out: Path) -> None:
    """The job's image artifacts (held-out renders), results and renders zip into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    items = stack.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]
    for it in items:
        if it["name"].rsplit(".", 1)[-1].lower() in ("png", "jpg", "jpeg", "json", "zip"):
            data = artifact(stack, job_id, it["name"])
            if data is not None:
                (out / it["name"]).write_bytes(data)


def subject_masks(n_views: int, distorted: bool) -> list[np.ndarray]:
    """Per photo, the pixels the object covers fully (ray traced alone through the same lens and
    pose): where the subject PSNR is measured, the same pixels in the room and alone."""
    lens = phone_lens(180, 320, distorted)
    alone = object_scene(0)
    return [render(alone, lens, c, supersample=2)[..., 3] > 0.999 for c in arc_poses(n_views)]


def subject_psnr(stack, job_id: str, files: dict[str, bytes], masks: list[np.ndarray]):
    """Mean over the held-out views of the PSNR on the object's pixels (subject_masks): the
    object's own quality, without the room's texture that the object alone does not have.
    None when the renders are missing."""
    results, renders = artifact(stack, job_id, "results.json"), artifact(stack, job_id, RENDERS)
    if results is None or renders is None:
        return None, 0
    order = [n for n in files if n.startswith("images/")]  # the k-th is pose k in every upload
    scores = []
    with zipfile.ZipFile(io.BytesIO(renders)) as zf:
        for v in json.loads(results)["views"]:
            k = order.index(v["source"])
            pred = np.asarray(Image.open(io.BytesIO(zf.read(f"rgb/{Path(v['name']).stem}.png"))))
            photo = Image.open(io.BytesIO(files[v["source"]]))
            truth = np.asarray(photo.convert("RGB"), dtype=np.float64)
            st = int(v.get("stride", 1))  # the job scored every st-th pixel of every st-th row
            truth, m = truth[::st, ::st], masks[k][::st, ::st]
            if pred.shape[:2] != truth.shape[:2]:
                continue
            mse = np.mean((pred[..., :3][m] / 255.0 - truth[m] / 255.0) ** 2)
            scores.append(-10 * math.log10(max(mse, 1e-10)))
    return (float(np.mean(scores)) if scores else None), len(scores)


def big_frame(stack, job_id: str, out: Path | None, width: int = 1080, height: int = 1920) -> dict:
    """Times one photo-sized frame through the API (a render job past RENDER_WAIT_PIXELS)."""
    c2w = np.asarray(arc_poses(50)[8]).tolist()
    t0 = time.monotonic()
    r = stack.client.post(
        f"/v1/jobs/{job_id}/render",
        json={"width": width, "height": height, "camera": {"c2w": c2w}, "fov_y_deg": FOV_Y_DEG},
    )
    if r.status_code == 200:
        view = {"status": "succeeded", "artifact_url": None}
        image = r.content
    else:
        r.raise_for_status()
        url = r.json()["url"]
        while True:
            view = stack.client.get(url).json()
            if view["status"] in ("succeeded", "failed"):
                break
            time.sleep(1.0)
        image = (
            stack.client.get(view["artifact_url"], follow_redirects=True).content
            if view["status"] == "succeeded"
            else None
        )
    seconds = time.monotonic() - t0
    if out is not None and image:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"frame-{width}x{height}.png").write_bytes(image)
    return {
        "status": view["status"],
        "http": r.status_code,
        "seconds": round(seconds, 1),
        "pixels_per_s": round(width * height / seconds),
        "error": view.get("error"),
    }


def fmt(r: dict) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    return (
        f"| {r['code']} | {r['kind']} | {r['upload']} | {r['budget_s']:.0f} | "
        f"{f(r['test_psnr'], '.2f')} | {f(r['test_ssim'], '.3f')} | {f(r['n_test'], 'd')} | "
        f"{f(r['subject_psnr'], '.2f')} | {f(r['train_psnr'], '.2f')} | {f(r['steps'], 'd')} | "
        f"{f(r['background_psnr'], '.2f')} | {f(r['train_share'], '.0%')} | "
        f"{f(r['samples_per_ray'], '.1f')} | {f(r['aabb_scale'], '')} | {f(r['sfm_s'], '.0f')} | "
        f"{r['wall_s']:.0f} | {r['status']} |"
    )


HEADER = (
    "| code | kind | upload | budget s | test PSNR | test SSIM | views | subject PSNR | "
    "train PSNR | steps | white-only PSNR | training share | samples/ray | box | SfM s | "
    "job wall s | status |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=None, help="checkout whose service runs")
    ap.add_argument("--label", default=None, help="the code column (default: the repo's name)")
    ap.add_argument("--budget", type=float, default=300.0)
    ap.add_argument(
        "--runs", default=RUNS, help="kind:upload,... (upload: posed|unposed|reordered|object)"
    )
    ap.add_argument("--views", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2, help="TORCH_THREADS of the worker")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument(
        "--artifacts", type=Path, default=None, help="save each job's image artifacts here"
    )
    ap.add_argument(
        "--nerf-config",
        type=json.loads,
        default=None,
        help="JSON config fields added to the nerf jobs' (e.g. '{\"max_samples_per_ray\": 256}')",
    )
    ap.add_argument(
        "--big-frame",
        default=None,
        metavar="WxH",
        help="after the first posed nerf job, time a frame of this size (1080x1920: the phone "
        "photos') through the API",
    )
    a = ap.parse_args(argv)

    import tests.support.stack as stack_mod

    repo = (a.repo or stack_mod.REPO).resolve()
    label = a.label or repo.name
    t0 = time.perf_counter()
    files = capture_files(a.views)
    files["reordered"] = reordered(files["unposed"])
    uploads = {k: zip_bytes(v) for k, v in files.items()}
    masks = {"posed": subject_masks(a.views, True), "object": subject_masks(a.views, False)}
    print(f"capture: {a.views} views, made in {time.perf_counter() - t0:.0f}s", flush=True)
    stack_mod.REPO = repo  # the processes run the other checkout's code
    kernels = os.environ.get("KERNELS_BUILD_DIR") or str(
        Path(__file__).resolve().parents[1] / ".kernels-build"
    )
    env = {
        "PYTHONPATH": str(repo),
        "TORCH_THREADS": str(a.threads),
        "KERNELS_BUILD_DIR": kernels,  # same sources, same compiled kernels
        "RENDER_TIMEOUT_S": "300",
    }
    rows = []
    with tempfile.TemporaryDirectory(prefix="capture_table_") as tmp:
        stack = stack_mod.new_stack(Path(tmp), "train,render,preprocess", env=env)
        stack._client = httpx.Client(base_url=stack.base_url, timeout=120, headers=stack.headers)
        try:
            print(HEADER, flush=True)
            for spec in a.runs.split(","):
                kind, upload = spec.split(":")
                job = run_job(
                    stack,
                    kind,
                    uploads[upload],
                    a.budget,
                    timeout=4 * a.budget + 900,
                    extra=a.nerf_config if kind == "nerf" else None,
                )
                r = row(label, kind, upload, a.budget, job)
                # scored where the renders are the photos' own lens: not SfM uploads, nor
                # splat, which trains on undistorted photos
                if kind == "nerf" and upload in masks:
                    r["subject_psnr"], r["subject_views"] = subject_psnr(
                        stack, job["id"], files[upload], masks[upload]
                    )
                rows.append(r)
                out = a.artifacts / f"{label}-{kind}-{upload}" if a.artifacts else None
                if out is not None:
                    save_images(stack, job["id"], out)
                print(fmt(r), flush=True)
                if r["error"]:
                    print(f"   error: {r['error']}", flush=True)
                if a.big_frame and (kind, upload) == ("nerf", "posed"):
                    w, h = (int(x) for x in a.big_frame.split("x"))
                    r["frame"] = big_frame(stack, job["id"], out, w, h)
                    a.big_frame = None  # the first posed nerf job only
                    print(f"   {w}x{h} frame: {r['frame']}", flush=True)
        finally:
            stack.stop()
    if a.json_out:
        a.json_out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
