"""Uploads without poses through the real API, Celery workers on train, render and preprocess,
and pycolmap: a textured scene rendered by experiments.sfm_capture (exact ground truth), its
poses stripped, reconstructs, trains in the same job and renders held-out true poses (after a
similarity alignment of the SfM frame to the true one) as well as the same photos trained with
their true poses. The same frames as a video reconstruct too and seed a splat job with SfM's
points. Trainings are tiny; experiments/sfm_table.py runs the full comparison."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from experiments.sfm_capture import align, make_capture, pose_errors, psnr, render_held_out
from tests.support.stack import stack_maker

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

N_FRAMES, SIZE = 24, 200
NERF = {
    "steps": 200,
    "samples_per_step": 8192,
    "max_rays_per_step": 2048,
    "log2_hashmap_size": 15,
    "n_levels": 12,
    "max_resolution": 512,
    "occupancy_resolution": 32,
    "max_samples_per_ray": 192,
    "checkpoint_every": 1000,
    "n_test_renders": 0,
    "background": "black",
    "train_background": "black",
}
SPLAT = {"steps": 30, "init": "points3d", "n_test_renders": 0, "background": "black"}
PSNR_GAP_DB = 1.5


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # SfM on 2 threads; the video's 48 frames are cut to 24 by sharpness.
    env = {"SFM_THREADS": "2", "SFM_NUM_FRAMES_TARGET": str(N_FRAMES)}
    with stack_maker(tmp_path_factory) as make:
        yield make("train,render,preprocess", env=env)


@pytest.fixture(scope="module")
def capture():
    return make_capture(N_FRAMES, SIZE, n_test=3)


def _submit(stack, data: bytes, name: str, kind: str, config: dict) -> str:
    r = stack.submit(data, name, kind=kind, config=config)
    assert r.status_code == 202, r.text
    return r.json()["id"]


@pytest.fixture(scope="module")
def jobs(stack, capture):
    """All three uploads at once (the worker takes them in turn), then wait for each."""
    ids = {
        "posed": _submit(stack, capture.posed_zip(), "posed.zip", "nerf", NERF),
        "photos": _submit(stack, capture.photos_zip(), "photos.zip", "nerf", NERF),
        "video": _submit(stack, capture.video(repeat=2), "walk.mp4", "splat", SPLAT),
    }
    out = {}
    for name, job_id in ids.items():
        job = stack.wait_status(job_id, "succeeded", "failed", "cancelled", timeout=420)
        assert job["status"] == "succeeded", f"{name}: {job['error']}\n{stack.logs()}"
        out[name] = job
    return out


def _sse_events(stack, job_id: str) -> list[tuple[str, dict]]:
    text = stack.client.get(f"/v1/jobs/{job_id}/events").text
    out, event = [], None
    for line in text.splitlines():
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event:
            out.append((event, json.loads(line.split(":", 1)[1])))
    return out


def _transforms(stack, job_id: str) -> dict:
    r = stack.client.get(f"/v1/jobs/{job_id}/artifacts/transforms.json")
    assert r.status_code == 200, r.text
    return r.json()


def _held_out_psnr(stack, job_id: str, capture, sim=None) -> float:
    preds = render_held_out(stack.client, job_id, capture, sim)
    return float(np.mean([psnr(p, g) for p, g in zip(preds, capture.test_rgb)]))


def _photo_index(path: str) -> int:
    return int(re.search(r"IMG_(\d+)", path).group(1))


def _video_index(path: str) -> int:
    return int(re.search(r"frame_(\d+)", path).group(1)) // 2  # each image shown twice


def test_photos_without_poses_register_and_train_like_posed(stack, capture, jobs):
    job = jobs["photos"]
    ds = job["dataset"]
    assert ds["sfm"] == "done" and ds["source_format"] == "sfm-images"
    assert ds["n_images"] == N_FRAMES and ds["n_registered"] >= 0.9 * N_FRAMES, ds
    assert ds["n_points3d"] > 100 and ds["camera_model"] == "OPENCV"
    assert ds["distortion_fixed_while_mapping"]
    assert ds["n_train"] + ds["n_test"] == ds["n_registered"]

    transforms = _transforms(stack, job["id"])
    assert (
        transforms["camera_model"] == "OPENCV" and len(transforms["frames"]) == ds["n_registered"]
    )
    est, true, sim = align(transforms, capture, _photo_index)
    rot_deg, centre = pose_errors(est, true, sim)
    assert rot_deg < 1.0 and centre < 0.01, (rot_deg, centre)
    # SfM's world was stood upright: the true world's up (+z) is the recovered one's
    tilt = np.degrees(np.arccos(np.clip((sim[1] @ [0.0, 0.0, 1.0])[2], -1, 1)))
    assert tilt < 3, tilt

    posed = _held_out_psnr(stack, jobs["posed"]["id"], capture)
    unposed = _held_out_psnr(stack, job["id"], capture, sim)
    # Both must have learned the scene: well above an all-black render.
    floor = float(np.mean([psnr(np.zeros(g.shape), g) for g in capture.test_rgb]))
    assert posed > floor + 3, (posed, floor)
    assert unposed > posed - PSNR_GAP_DB, (unposed, posed)


def test_stages_are_reported_in_order_on_status_and_stream(stack, jobs):
    job = jobs["photos"]
    assert job["progress"]["stage"] == "train" and job["progress"]["step"] == NERF["steps"]
    progress = [d for e, d in _sse_events(stack, job["id"]) if e == "progress"]
    stages = [p["stage"] for p in progress]
    first_train = stages.index("train")
    assert stages[:first_train] and set(stages[:first_train]) == {"sfm"}, stages
    assert set(stages[first_train:]) == {"train"}, stages
    sfm = [p["step"] for p in progress[:first_train]]
    assert all(p["total_steps"] == 100 for p in progress[:first_train])
    assert sfm == sorted(sfm) and sfm[-1] == 100 and len(set(sfm)) >= 3, sfm
    statuses = [d["status"] for e, d in _sse_events(stack, job["id"]) if e == "status"]
    assert "failed" not in statuses and statuses[-1] == "succeeded", statuses


def test_video_registers_and_seeds_a_splat_with_sfm_points(stack, capture, jobs):
    job = jobs["video"]
    ds = job["dataset"]
    assert ds["source_format"] == "sfm-video" and ds["matcher"] == "sequential"
    assert ds["n_video_frames"] == 2 * N_FRAMES and ds["n_images"] == N_FRAMES, ds
    assert ds["n_registered"] >= 0.9 * N_FRAMES, ds
    est, true, sim = align(_transforms(stack, job["id"]), capture, _video_index)
    rot_deg, centre = pose_errors(est, true, sim)
    assert rot_deg < 1.5 and centre < 0.02, (rot_deg, centre)
    # The splat job started from SfM's points (init=points3d would have failed without them).
    points = (stack.job_dir(job["id"]) / "dataset" / "points3D.txt").read_text().splitlines()
    assert len([p for p in points if not p.startswith("#")]) == ds["n_points3d"] > 100
    assert job["metrics"]["test_psnr"] > 10


def test_nothing_but_the_job_is_left(stack, jobs):
    for job in jobs.values():
        names = {p.name for p in stack.job_dir(job["id"]).iterdir()}
        assert not names & {"capture", "sfm", "dataset.partial", "upload"}, names
