"""kind=nerf end to end through the real HTTP API and a real Celery worker: a small synthetic
scene (exact ground truth) trains in well under a minute, then renders are checked against the
held-out photos, depth/alpha against the ray-traced truth, paths, the model cache, artifacts
and the checkpoint download."""

from __future__ import annotations

import io
import json
import struct
import time
import zipfile

import numpy as np
import pytest

from experiments.synthetic_scene import FOV_X_DEG
from experiments.synthetic_scene import render as gt_render
from tests.support.scenes import (
    background_baseline,
    decode,
    on_white,
    psnr,
    render_path,
    scene_upload,
    train_scene,
)

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

SIZE, N_TRAIN, N_TEST = 40, 24, 4
CONFIG = {
    "steps": 400,
    "samples_per_step": 8192,
    "max_rays_per_step": 2048,
    "log2_hashmap_size": 15,
    "n_levels": 12,
    "max_resolution": 512,
    "occupancy_resolution": 32,
    "max_samples_per_ray": 192,
    "checkpoint_every": 100,
    "n_test_renders": 2,
}


@pytest.fixture(scope="module")
def scene():
    return scene_upload(SIZE, N_TRAIN, N_TEST)


@pytest.fixture(scope="module")
def trained(fs_stack, scene):
    return train_scene(fs_stack, scene, "nerf", CONFIG)


def render(stack, job_id, body):
    return stack.client.post(f"/v1/jobs/{job_id}/render", json=body)


def test_training_beats_the_background_baseline(fs_stack, trained, scene):
    job = trained["job"]
    # The floor: predicting only the (white) background for every held-out pixel.
    baseline = background_baseline(scene)
    m = job["metrics"]
    assert m["test_psnr"] > baseline + 8, (m, baseline)
    assert m["background_psnr"] == pytest.approx(baseline, abs=0.2)
    assert 0 < m["test_ssim"] <= 1 and m["test_ssim"] > 0.6
    assert m["steps"] == CONFIG["steps"]
    p = job["progress"]
    assert p["step"] == CONFIG["steps"] and p["rays_per_s"] > 0 and p["samples_per_ray"] > 0
    events = fs_stack.events(trained["id"])
    psnrs = [
        e["data"]["psnr"]
        for e in events
        if e["event"] == "progress" and e["data"].get("psnr") is not None
    ]
    assert len(psnrs) >= 2 and max(psnrs[-3:]) > psnrs[0] + 5


def test_render_of_a_test_pose_matches_the_held_out_photo(fs_stack, trained, scene):
    scores, first = [], None
    for c2w, gt in zip(scene["test_c2w"], scene["test_rgba"]):
        r = render(
            fs_stack,
            trained["id"],
            {"width": SIZE, "height": SIZE, "camera": {"c2w": c2w}, "fov_x_deg": FOV_X_DEG},
        )
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "image/png"
        img = np.asarray(decode(r.content).convert("RGB"), dtype=np.float64) / 255
        first = img if first is None else first
        scores.append(psnr(img, on_white(gt)))
    baseline = background_baseline(scene)
    assert np.mean(scores) > max(18.0, baseline + 8), (scores, baseline)
    # The API's renders of the world-frame poses reproduce the worker's own test evaluation.
    assert np.mean(scores) == pytest.approx(trained["job"]["metrics"]["test_psnr"], abs=1.0)
    # Default intrinsics are the training camera's: the same frame without fov_x_deg.
    r = render(
        fs_stack,
        trained["id"],
        {"width": SIZE, "height": SIZE, "camera": {"c2w": scene["test_c2w"][0]}},
    )
    img = np.asarray(decode(r.content).convert("RGB"), dtype=np.float64) / 255
    assert psnr(img, first) > 40


def test_depth_and_alpha_outputs_match_the_ray_traced_truth(fs_stack, trained, scene):
    c2w = scene["test_c2w"][1]
    truth = gt_render(np.asarray(c2w), SIZE, SIZE, fov_x_deg=FOV_X_DEG)
    body = {"width": SIZE, "height": SIZE, "camera": {"c2w": c2w}, "fov_x_deg": FOV_X_DEG}
    r = render(fs_stack, trained["id"], {**body, "output": "alpha"})
    assert r.status_code == 200, r.text
    alpha = np.asarray(decode(r.content).convert("L"), dtype=np.float64) / 255
    assert np.mean(np.abs(alpha - truth["rgba"][..., 3])) < 0.08
    r = render(fs_stack, trained["id"], {**body, "output": "depth"})
    im = decode(r.content)
    near, far = float(im.text["nf-depth-near"]), float(im.text["nf-depth-far"])
    v = np.asarray(im.convert("L"), dtype=np.float64)
    hit = (v > 0) & np.isfinite(truth["depth"])
    depth = near + (255 - v) / 254 * (far - near)
    assert hit.mean() > 0.2
    # World units (the stored normalisation is undone): within a few hundredths of the 4-unit camera distance.
    assert np.median(np.abs(depth[hit] - truth["depth"][hit])) < 0.08
    r = render(fs_stack, trained["id"], {**body, "format": "jpeg"})
    assert r.headers["content-type"] == "image/jpeg" and decode(r.content).size == (SIZE, SIZE)


def test_look_at_camera_in_world_frame(fs_stack, trained):
    eye = (3.0, -2.0, 1.5)
    body = {
        "width": 24,
        "height": 20,
        "fov_x_deg": 45,
        "camera": {"look_at": {"eye": eye, "target": (0, 0, 0), "up": (0, 0, 1)}},
    }
    r = render(fs_stack, trained["id"], body)
    assert r.status_code == 200, r.text
    img = np.asarray(decode(r.content).convert("RGB"), dtype=np.float64) / 255
    from experiments.synthetic_scene import look_at

    truth = on_white(gt_render(look_at(eye), 24, 20, fov_x_deg=45)["rgba"])
    assert img.shape == (20, 24, 3) and psnr(img, truth) > 18


def test_second_render_reuses_the_cached_model(fs_stack, trained, scene):
    # 96x96 is more rays than one render chunk: chunking must stitch the image together.
    body = {
        "width": 96,
        "height": 96,
        "camera": {"c2w": scene["test_c2w"][2]},
        "background": "black",
    }
    first = decode(render(fs_stack, trained["id"], body).content)
    second = decode(render(fs_stack, trained["id"], body).content)
    assert second.size == (96, 96) and np.array_equal(np.asarray(first), np.asarray(second))
    truth = gt_render(np.asarray(scene["test_c2w"][2]), 96, 96, fov_x_deg=FOV_X_DEG)["rgba"]
    img = np.asarray(second.convert("RGB"), dtype=np.float64) / 255
    assert psnr(img, truth[..., :3] * truth[..., 3:]) > 17  # on black
    assert first.text["nf-model-cache"] in ("hit", "miss")
    assert second.text["nf-model-cache"] == "hit"
    assert second.text["nf-checkpoint-step"] == str(CONFIG["steps"])


def test_render_path_orbit_webp_and_pose_zip(fs_stack, trained, scene):
    r = render_path(
        fs_stack,
        trained["id"],
        width=20,
        height=16,
        format="webp",
        orbit={"radius": 4, "n_frames": 3, "up": (0, 0, 1)},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/webp"
    im = decode(r.content)
    assert im.format == "WEBP" and im.size == (20, 16) and getattr(im, "n_frames", 1) == 3
    poses = [{"c2w": c} for c in scene["test_c2w"][:2]]
    r = render_path(
        fs_stack,
        trained["id"],
        width=SIZE,
        height=SIZE,
        format="zip",
        fov_x_deg=FOV_X_DEG,
        poses=poses,
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(r.content)) as zf:
        names = sorted(zf.namelist())
        assert names == ["frame_000.png", "frame_001.png"]
        frame = np.asarray(decode(zf.read(names[1])).convert("RGB"), dtype=np.float64) / 255
    assert psnr(frame, on_white(scene["test_rgba"][1])) > 17


def test_bad_render_requests_are_4xx_with_detail(fs_stack, trained):
    url = f"/v1/jobs/{trained['id']}/render"
    for body in (
        {"width": 16, "height": 16},  # no camera
        {"width": 16, "height": 16, "output": "normals", "camera": {"c2w": np.eye(4).tolist()}},
        {"width": 16, "height": 16, "camera": {"c2w": (2 * np.eye(4)).tolist()}},
    ):  # not rigid
        r = fs_stack.client.post(url, json=body)
        assert r.status_code == 422, (body, r.text)
        assert isinstance(r.json()["detail"], str) and r.json()["detail"]
    r = fs_stack.client.post(
        f"/v1/jobs/{trained['id']}/render/path",
        json={"width": 15, "height": 16, "format": "mp4", "orbit": {"radius": 3, "n_frames": 2}},
    )
    assert r.status_code == 422 and "even" in r.json()["detail"]


def test_artifacts_are_listed_and_downloadable(fs_stack, trained):
    job_id = trained["id"]
    names = trained["job"]["metrics"]["artifacts"]
    renders = [n for n in names if n.startswith("test_") and n.endswith(".png")]
    assert len(renders) == CONFIG["n_test_renders"]
    assert {"results.json", "test_renders.zip"} <= set(names)
    listed = fs_stack.client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]
    assert sorted(i["name"] for i in listed) == sorted(names)
    r = fs_stack.client.get(f"/v1/jobs/{job_id}/artifacts/{names[0]}")
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    assert decode(r.content).size == (SIZE, SIZE)
    for bad in ("..%2Fjob.json", ".hidden", "nope.png", "a%00b"):
        r = fs_stack.client.get(f"/v1/jobs/{job_id}/artifacts/{bad}")
        assert r.status_code in (404, 422) and r.json()["detail"], bad


def test_checkpoint_download_is_a_self_describing_safetensors(fs_stack, trained):
    from safetensors.torch import load

    r = fs_stack.client.get(f"/v1/jobs/{trained['id']}/checkpoint")
    assert r.status_code == 200, r.text
    assert r.headers["x-checkpoint-step"] == str(CONFIG["steps"])
    (n,) = struct.unpack("<Q", r.content[:8])
    meta = json.loads(json.loads(r.content[8 : 8 + n])["__metadata__"]["nf_meta"])
    assert (
        meta["config"]["log2_hashmap_size"] == CONFIG["log2_hashmap_size"]
        and "normalization" in meta
    )
    tensors = load(r.content)
    assert tensors["field.encoding.params"].shape[1] == 2 and "grid.bits" in tensors


# -- outputs people take away: evaluation artifacts, depth files, MP4, nerfstudio paths ------
def artifact(stack, job_id, name) -> bytes:
    r = stack.client.get(f"/v1/jobs/{job_id}/artifacts/{name}")
    assert r.status_code == 200, r.text
    return r.content


def test_results_json_and_zip_of_every_test_view(fs_stack, trained, scene):
    job_id, m = trained["id"], trained["job"]["metrics"]
    results = json.loads(artifact(fs_stack, job_id, "results.json"))
    views = results["views"]
    assert [v["index"] for v in views] == list(range(N_TEST))
    assert all(v["name"].startswith("images/") and 0 < v["ssim"] <= 1 for v in views)
    assert np.mean([v["psnr"] for v in views]) == pytest.approx(m["test_psnr"], abs=1e-3)
    # No LPIPS weights on this worker: the score is absent and the job says why.
    assert "lpips" not in views[0] and "LPIPS_MODEL" in results["lpips_absent"]
    assert "test_lpips" not in m and m["lpips_absent"] == results["lpips_absent"]
    with zipfile.ZipFile(io.BytesIO(artifact(fs_stack, job_id, "test_renders.zip"))) as zf:
        names = sorted(zf.namelist())
        assert len([n for n in names if n.startswith("rgb/")]) == N_TEST
        assert len([n for n in names if n.startswith("depth/")]) == N_TEST
        for i, v in enumerate(views):
            stem = v["name"].rsplit("/", 1)[-1].rsplit(".", 1)[0]
            rgb = np.asarray(decode(zf.read(f"rgb/{stem}.png")).convert("RGB"), np.float64) / 255
            # the photo of this view, scored independently, matches what results.json says
            assert psnr(rgb, on_white(scene["test_rgba"][i])) == pytest.approx(v["psnr"], abs=0.2)
            depth_im = decode(zf.read(f"depth/{stem}.png"))
            assert depth_im.mode in ("I;16", "I")
            mm = np.asarray(depth_im, dtype=np.float64)
            truth = gt_render(np.asarray(scene["test_c2w"][i]), SIZE, SIZE, fov_x_deg=FOV_X_DEG)
            hit = (truth["rgba"][..., 3] > 0.99) & (mm > 0)
            assert hit.mean() > 0.05
            err = np.abs(mm[hit] / 1000.0 - truth["depth"][hit])
            assert np.median(err) < 0.05 * np.median(truth["depth"][hit])


def test_depth_as_png16_millimetres_and_float32_npy(fs_stack, trained, scene):
    c2w = scene["test_c2w"][1]
    body = {"width": SIZE, "height": SIZE, "camera": {"c2w": c2w}, "fov_x_deg": FOV_X_DEG}
    r = render(fs_stack, trained["id"], {**body, "output": "depth", "format": "npy"})
    assert r.status_code == 200 and r.headers["x-checkpoint-step"] == str(CONFIG["steps"])
    depth = np.load(io.BytesIO(r.content), allow_pickle=False)
    assert depth.dtype == np.float32 and depth.shape == (SIZE, SIZE)
    truth = gt_render(np.asarray(c2w), SIZE, SIZE, fov_x_deg=FOV_X_DEG)
    hit = (truth["rgba"][..., 3] > 0.99) & (depth > 0)
    assert np.median(np.abs(depth[hit] - truth["depth"][hit])) < 0.05 * np.median(
        truth["depth"][hit]
    )
    r = render(fs_stack, trained["id"], {**body, "output": "depth", "format": "png16"})
    mm = np.asarray(decode(r.content), dtype=np.float64)
    assert np.abs(mm[hit] - np.round(depth[hit] * 1000)).max() <= 1
    r = render(fs_stack, trained["id"], {**body, "format": "png16"})  # rgb has no 16-bit form
    assert r.status_code == 422 and "depth" in r.json()["detail"]


def read_video(data: bytes) -> tuple[list[np.ndarray], float]:
    """Frames (H, W, 3) uint8 and the frame rate, read back with PyAV."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        return frames, float(stream.average_rate)


def test_mp4_path_reads_back(fs_stack, trained):
    r = render_path(
        fs_stack,
        trained["id"],
        width=24,
        height=16,
        format="mp4",
        fps=12,
        orbit={"radius": 3.5, "n_frames": 5},
    )
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4", r.text
    frames, fps = read_video(r.content)
    assert len(frames) == 5 and frames[0].shape == (16, 24, 3) and fps == pytest.approx(12)


def ns_camera_path(c2w, fov_y: float, width: int, height: int) -> dict:
    """A camera_path.json as nerfstudio's viewer writes it, viewer-only keys included."""
    flat = [float(v) for row in np.asarray(c2w, np.float64) for v in row]
    return {
        "keyframes": [{"matrix": str(flat), "fov": fov_y, "aspect": width / height}],
        "camera_type": "perspective",
        "render_height": height,
        "render_width": width,
        "camera_path": [{"camera_to_world": flat, "fov": fov_y, "aspect": width / height}],
        "fps": 24,
        "seconds": 1,
        "smoothness_value": 0.5,
        "is_cycle": False,
        "crop": None,
    }


def first_zip_frame(data: bytes) -> np.ndarray:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return np.asarray(decode(zf.read(sorted(zf.namelist())[0])).convert("RGB"))


def test_nerfstudio_camera_path_renders_what_the_c2w_request_renders(fs_stack, trained, scene):
    c2w = np.asarray(scene["test_c2w"][3], np.float64)
    w, h, fov_y = 24, 20, 40.0
    ref = render(
        fs_stack,
        trained["id"],
        {"width": w, "height": h, "camera": {"c2w": c2w.tolist()}, "fov_y_deg": fov_y},
    )
    assert ref.status_code == 200
    ref = np.asarray(decode(ref.content).convert("RGB"))
    url = f"/v1/jobs/{trained['id']}/render/path"
    # the file as the body, with our keys beside its own
    r = fs_stack.client.post(
        url, json={**ns_camera_path(c2w, fov_y, w, h), "frame": "world", "format": "zip"}
    )
    assert r.status_code == 200, r.text
    assert np.array_equal(first_zip_frame(r.content), ref)
    # nerfstudio's frame, with the dataparser transform nerfstudio would have written
    theta = 0.7
    rot = np.array(
        [[np.cos(theta), -np.sin(theta), 0], [np.sin(theta), np.cos(theta), 0], [0, 0, 1]]
    )
    t, s = np.array([0.3, -0.2, 0.5]), 0.25
    ns = np.eye(4)
    ns[:3, :3] = rot @ c2w[:3, :3]
    ns[:3, 3] = s * (rot @ c2w[:3, 3] + t)
    r = fs_stack.client.post(
        url,
        json={
            "camera_path": ns_camera_path(ns, fov_y, w, h),
            "frame": "nerfstudio",
            "dataparser_transform": {
                "transform": np.hstack([rot, t[:, None]]).tolist(),
                "scale": s,
            },
            "format": "zip",
        },
    )
    assert r.status_code == 200, r.text
    assert np.abs(first_zip_frame(r.content).astype(int) - ref.astype(int)).max() <= 2


def test_bad_camera_paths_are_422_with_detail(fs_stack, trained, scene):
    url = f"/v1/jobs/{trained['id']}/render/path"
    good = ns_camera_path(scene["test_c2w"][0], 40.0, 16, 16)
    sheared = {
        **good,
        "camera_path": [
            {
                **good["camera_path"][0],
                "camera_to_world": [2.0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1],
            }
        ],
    }
    for body, word in (
        ({"camera_path": good}, "frame"),
        ({"camera_path": good, "frame": "ngp"}, "frame"),
        ({"camera_path": {**good, "camera_type": "fisheye"}, "frame": "world"}, "perspective"),
        ({"camera_path": sheared, "frame": "world"}, "orthonormal"),
        ({"camera_path": {**good, "camera_path": []}, "frame": "world"}, "camera_path"),
        ({"camera_path": good, "frame": "world", "format": "avi"}, "format"),
    ):
        r = fs_stack.client.post(url, json=body)
        assert r.status_code == 422, (body, r.text)
        assert word in r.json()["detail"], r.json()["detail"]
    # 400 frames, as nerfstudio's viewer writes them, are far over MAX_JSON_BODY_KB but not
    # over the path route's own body room: the answer is about the missing frame, not the size
    long = {**good, "camera_path": good["camera_path"] * 400, "keyframes": good["keyframes"] * 400}
    r = fs_stack.client.post(url, json={"camera_path": long})
    assert len(json.dumps(long)) > 128 * 1024
    assert r.status_code == 422 and "frame" in r.json()["detail"], r.text
    nan = {**good, "camera_path": [{**good["camera_path"][0], "fov": float("nan")}]}
    r = fs_stack.client.post(
        url,
        content=json.dumps({"camera_path": nan, "frame": "world"}),  # NaN: what json.dumps writes
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422 and r.json()["detail"]


def test_a_path_job_reports_progress_and_lands_an_mp4_artifact(fs_stack, trained):
    job_id = trained["id"]
    r = fs_stack.client.post(
        f"/v1/jobs/{job_id}/render/path",
        json={
            "width": 16,
            "height": 16,
            "format": "mp4",
            "mode": "job",
            "orbit": {"radius": 3.5, "n_frames": 6},
        },
    )
    assert r.status_code == 202, r.text
    state = r.json()
    assert state["status"] in ("queued", "running") and state["n_frames"] == 6
    assert r.headers["location"] == state["url"]
    seen = set()
    deadline = time.monotonic() + 60
    while state["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
        state = fs_stack.client.get(state["url"]).json()
        seen.add(state["frames_done"])
    assert state["status"] == "succeeded", state["error"]
    assert state["frames_done"] == 6 and state["checkpoint_step"] == CONFIG["steps"]
    frames, _ = read_video(artifact(fs_stack, job_id, state["artifact"]))
    assert len(frames) == 6 and frames[0].shape == (16, 16, 3)
    assert fs_stack.client.get(f"/v1/jobs/{job_id}/renders/not-an-id").status_code == 404


def test_training_cameras_download_as_a_camera_path_that_renders_them(fs_stack, trained, scene):
    job_id = trained["id"]
    r = fs_stack.client.get(f"/v1/jobs/{job_id}/camera_path")
    assert r.status_code == 200, r.text
    cp = r.json()
    assert len(cp["camera_path"]) == N_TRAIN and (cp["render_width"], cp["render_height"]) == (
        SIZE,
        SIZE,
    )
    # world frame: the poses the upload gave (transforms_train.json), fov from its camera_angle_x
    first = np.asarray(cp["camera_path"][0]["camera_to_world"]).reshape(4, 4)
    np.testing.assert_allclose(first, np.asarray(scene["train_c2w"][0]), atol=1e-4)
    assert cp["camera_path"][0]["fov"] == pytest.approx(FOV_X_DEG, abs=1e-3)  # square images
    few = {**cp, "camera_path": cp["camera_path"][:2]}
    r = fs_stack.client.post(f"/v1/jobs/{job_id}/render/path", json={**few, "format": "zip"})
    assert r.status_code == 200, r.text
    ref = render(
        fs_stack,
        job_id,
        {"width": SIZE, "height": SIZE, "camera": {"c2w": first.tolist()}, "fov_y_deg": FOV_X_DEG},
    )
    assert (
        np.abs(
            first_zip_frame(r.content).astype(int)
            - np.asarray(decode(ref.content).convert("RGB")).astype(int)
        ).max()
        <= 1
    )
    assert fs_stack.client.get(f"/v1/jobs/{job_id}/camera_path?split=nope").status_code == 404


def test_the_default_budget_is_the_cpu_one(trained):
    # No time_limit_s: the CPU budget, reported with the metrics.
    assert trained["job"]["metrics"]["time_limit_s"] == 300.0


# Its shares of a 20 s budget are wall time: run with nothing beside it (`make test`).
@pytest.mark.alone
def test_time_budget_bounds_the_job_evaluation_included(fs_stack, scene):
    # No steps: the job trains until its budget ends, leaves room for a full-size evaluation,
    # and the ETA reported meanwhile never promises more than the budget holds.
    from worker.budget import allowance

    # 20 s: the evaluation and the first curve point cost about a second however short the
    # budget; in 12 s that left the 80 % for training within a second of the jitter of a busy CPU.
    limit = 20.0
    config = {k: v for k, v in CONFIG.items() if k != "steps"}
    config.update(time_limit_s=limit, occupancy_warmup_steps=32)
    r = fs_stack.submit(
        scene["zip"], "scene.zip", kind="nerf", config=config, content_type="application/zip"
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    etas = []
    job = fs_stack.wait_for(
        job_id,
        lambda j: etas.append(j["progress"]) or j["status"] in ("succeeded", "failed"),
        120,
        "finished",
    )
    assert job["status"] == "succeeded", job["error"]
    m = job["metrics"]
    assert m["time_limit_s"] == limit and m["steps"] > 0 and job["config"]["steps"] is None
    assert m["budget_used_s"] <= limit + allowance(limit)
    # The budget goes to training: curve points, checkpoints and the evaluation share the rest,
    # and the evaluation still scores every held-out view.
    assert m["train_s"] >= 0.8 * limit, m["budget_shares"]
    assert m["budget_shares"]["train"] == pytest.approx(m["train_s"] / limit, abs=1e-3)
    assert m["curve_s"] + m["checkpoint_s"] + m["eval_s"] + m["train_s"] <= m["budget_used_s"]
    assert m["n_test"] == m["eval_views"] == N_TEST and m["eval_scale"] == 1
    assert len(m["curve"]) >= 2  # points on the pixel subsample, then the final evaluation
    running = [p for p in etas if p and p.get("eta_s") is not None and p["step"] > 0]
    assert running and all(p["eta_s"] <= limit for p in running)
    # Progress counts towards the steps the budget holds, and ends on the steps it held.
    assert all(p["total_steps"] > p["step"] for p in running[:-1] if p["eta_s"] > 1)
    assert job["progress"]["total_steps"] == job["progress"]["step"] == m["steps"]
