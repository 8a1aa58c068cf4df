"""The client's `nf` (clients/python, `python -m nf_client`) as a user runs it (a subprocess)
against the real stack; and the server's `nf`, which hands the same commands to it."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
from PIL import Image

from tests.support.stack import REPO, TEST_KEY, free_port, png_bytes

TRAIN = {"steps": 300, "resolution": 32}


CLIENT_SRC = REPO / "clients" / "python" / "src"


def nf(
    *args: str, url: str | None, timeout: float = 180, module: str = "nf_client"
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NF_URL"}
    env["NF_API_KEY"] = TEST_KEY
    # the client from this checkout, whether or not the environment has it installed
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(CLIENT_SRC), env.get("PYTHONPATH", "")) if p
    )
    if url is not None:
        env["NF_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "photo.png"
    path.write_bytes(png_bytes(40, 30))
    return path


@pytest.fixture(scope="module")
def trained(fs_stack, photo):
    """submit + wait through the CLI: (job id, wait's result)."""
    sub = nf(
        "submit",
        str(photo),
        "--kind",
        "image",
        "--config",
        json.dumps(TRAIN),
        url=fs_stack.base_url,
    )
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    uuid.UUID(job_id)  # stdout is just the id, for $(nf submit ...)
    waited = nf("wait", job_id, url=fs_stack.base_url)
    return job_id, waited


def test_submit_and_wait(fs_stack, trained):
    job_id, waited = trained
    assert waited.returncode == 0, waited.stderr
    job = fs_stack.client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["config"]["steps"] == TRAIN["steps"]
    assert f"job {job_id} succeeded" in waited.stdout
    assert f"psnr={job['metrics']['psnr']:.4g}" in waited.stdout
    # The progress bar (stderr) reached the last step.
    assert f"step {TRAIN['steps']}/{TRAIN['steps']}" in waited.stderr, waited.stderr


def test_status_and_list(fs_stack, trained):
    job_id, _ = trained
    st = nf("status", job_id, "--json", url=fs_stack.base_url)
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout) == fs_stack.client.get(f"/v1/jobs/{job_id}").json()

    human = nf("status", job_id, url=fs_stack.base_url)
    assert human.returncode == 0 and "succeeded" in human.stdout and job_id in human.stdout

    listed = nf("--json", "list", "--status", "succeeded", url=fs_stack.base_url)
    assert listed.returncode == 0, listed.stderr
    assert job_id in [j["id"] for j in json.loads(listed.stdout)["items"]]
    table = nf("list", url=fs_stack.base_url)
    assert table.returncode == 0 and job_id in table.stdout


def test_render_matches_the_api(fs_stack, trained, tmp_path):
    job_id, _ = trained
    out = tmp_path / "frames" / "frame.png"
    r = nf(
        "render",
        job_id,
        "--width",
        "96",
        "--height",
        "72",
        "--out",
        str(out),
        url=fs_stack.base_url,
    )
    assert r.returncode == 0, r.stderr
    got = np.asarray(Image.open(out).convert("RGB"), dtype=np.int16)
    assert got.shape == (72, 96, 3)
    direct = fs_stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": 96, "height": 72})
    want = np.asarray(Image.open(io.BytesIO(direct.content)).convert("RGB"), dtype=np.int16)
    assert np.abs(got - want).max() <= 1
    assert got.std() > 10  # a picture, not a blank frame


def test_render_job_is_waited_for(fs_stack, trained, tmp_path):
    # --mode job: the server answers 202 with a render job; the CLI polls it and writes the file.
    job_id, _ = trained
    out = tmp_path / "job.png"
    size = ["--width", "64", "--height", "48"]
    r = nf("render", job_id, *size, "--mode", "job", "--out", str(out), url=fs_stack.base_url)
    assert r.returncode == 0, r.stderr
    got = np.asarray(Image.open(out).convert("RGB"), dtype=np.int16)
    direct = fs_stack.client.post(f"/v1/jobs/{job_id}/render", json={"width": 64, "height": 48})
    want = np.asarray(Image.open(io.BytesIO(direct.content)).convert("RGB"), dtype=np.int16)
    assert got.shape == (48, 64, 3) and np.abs(got - want).max() <= 1


def test_camera_requests_pass_validation(fs_stack, trained, tmp_path):
    """--look-at and --orbit build requests the API accepts; the image kind then says no camera."""
    job_id, _ = trained
    out = tmp_path / "view.png"
    r = nf(
        "render",
        job_id,
        "--look-at",
        "4,0,2",
        "0,0,0",
        "--fov",
        "40",
        "--output",
        "depth",
        "--out",
        str(out),
        url=fs_stack.base_url,
    )
    assert r.returncode == 1 and "HTTP 422: image jobs are 2D fields" in r.stderr, r.stderr
    assert not out.exists()
    bad = nf(
        "render", job_id, "--look-at", "1,1,1", "1,1,1", "--out", str(out), url=fs_stack.base_url
    )
    assert bad.returncode == 1 and "HTTP 422" in bad.stderr and "same point" in bad.stderr, (
        bad.stderr
    )
    anim = tmp_path / "orbit.webp"
    p = nf("path", job_id, "--orbit", "4,30,4", "--out", str(anim), url=fs_stack.base_url)
    # a valid path request: refused by the kind, not by request validation
    assert p.returncode == 1 and "HTTP 422: image jobs do not support" in p.stderr, p.stderr
    assert not anim.exists()


def test_cancel_and_wait_reports_it(fs_stack, photo):
    sub = nf(
        "submit",
        str(photo),
        "--config",
        '{"steps": 200000, "resolution": 32}',
        url=fs_stack.base_url,
    )
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    fs_stack.wait_for(job_id, lambda j: j["status"] == "running", what="running")
    c = nf("cancel", job_id, url=fs_stack.base_url)
    assert c.returncode == 0, c.stderr
    w = nf("wait", job_id, url=fs_stack.base_url, timeout=60)
    assert w.returncode == 1 and f"job {job_id} cancelled" in w.stdout, (w.stdout, w.stderr)
    again = nf("cancel", job_id, url=fs_stack.base_url)
    assert again.returncode == 1 and "HTTP 409" in again.stderr


def test_errors_are_one_clear_line(fs_stack, tmp_path):
    unknown = str(uuid.uuid4())
    r = nf("status", unknown, url=fs_stack.base_url)
    assert r.returncode == 1 and r.stderr.startswith("error: HTTP 404") and unknown in r.stderr
    assert "Traceback" not in r.stderr

    text = tmp_path / "notes.txt"
    text.write_text("not a photo")
    r = nf("submit", str(text), url=fs_stack.base_url)
    assert r.returncode == 1 and r.stderr.startswith("error: HTTP 4"), r.stderr
    assert len(fs_stack.client.get("/v1/jobs", params={"limit": 500}).json()["items"]) == len(
        fs_stack.job_dirs()
    )  # nothing half-made on disk

    r = nf("submit", str(tmp_path / "missing.png"), url=fs_stack.base_url)
    assert r.returncode == 1 and "is not a file" in r.stderr

    r = nf("submit", str(text), "--config", "{steps: 3", url=fs_stack.base_url)
    assert r.returncode == 2 and "not valid JSON" in r.stderr  # argparse usage error

    r = nf(
        "render",
        unknown,
        "--look-at",
        "1,2",
        "0,0,0",
        "--out",
        str(tmp_path / "x.png"),
        url=fs_stack.base_url,
    )
    assert r.returncode == 2 and "three numbers" in r.stderr

    r = nf(
        "path",
        unknown,
        "--orbit",
        "4,30,12",
        "--out",
        str(tmp_path / "orbit.xyz"),
        url=fs_stack.base_url,
    )
    assert r.returncode == 1 and "format" in r.stderr

    dead = f"http://127.0.0.1:{free_port()}"
    r = nf("--url", dead, "list", url=fs_stack.base_url)  # --url wins over NF_URL
    assert r.returncode == 1 and "cannot reach" in r.stderr and dead in r.stderr


def test_render_before_success_is_refused(fs_stack, photo, tmp_path):
    sub = nf(
        "submit",
        str(photo),
        "--config",
        '{"steps": 200000, "resolution": 32}',
        url=fs_stack.base_url,
    )
    job_id = sub.stdout.strip()
    try:
        out = tmp_path / "early.png"
        r = nf("render", job_id, "--out", str(out), url=fs_stack.base_url)
        assert r.returncode == 1 and "HTTP 409" in r.stderr
        assert not out.exists()
    finally:
        fs_stack.client.post(f"/v1/jobs/{job_id}/cancel")
        fs_stack.wait_status(job_id, "cancelled", "failed", "succeeded")


def test_events_are_json_lines_and_uploads_report_progress(fs_stack, photo, trained):
    job_id, _ = trained
    ev = nf("events", job_id, url=fs_stack.base_url)
    assert ev.returncode == 0, ev.stderr
    lines = [json.loads(line) for line in ev.stdout.splitlines()]
    assert lines[-1]["event"] == "end" and lines[-1]["data"]["status"] == "succeeded"
    assert any(e["event"] == "progress" for e in lines)
    ids = [e["id"] for e in lines if e["id"] is not None]
    assert ids == sorted(ids) and ids
    after = nf("events", job_id, "--after", str(ids[-1]), url=fs_stack.base_url)
    assert [json.loads(line)["event"] for line in after.stdout.splitlines()] == ["end"]

    from nf_client import Client

    sent = []
    with Client(fs_stack.base_url, key=TEST_KEY) as client:
        job = client.submit(photo, "image", TRAIN, on_progress=lambda d, t: sent.append((d, t)))
        client.cancel(job["id"])
    size = photo.stat().st_size
    assert sent and sent[-1] == (size, size) and all(t == size for _, t in sent)


def test_the_servers_nf_hands_user_commands_to_the_client(fs_stack, trained):
    job_id, _ = trained
    st = nf("status", job_id, "--json", url=fs_stack.base_url, module="service.cli")
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["id"] == job_id
    # and the client's `nf db` hands the operator's command back to the server package
    db = nf("db", "--help", url=fs_stack.base_url)
    assert db.returncode == 0 and "upgrade" in db.stdout, db.stderr


def test_python_client_waits_renders_and_lists(fs_stack, trained):
    from nf_client import ApiError, Client

    job_id, _ = trained
    with Client(fs_stack.base_url, key=TEST_KEY) as client:
        seen = []
        job = client.wait(job_id, on_event=seen.append)
        assert job["status"] == "succeeded" and seen[-1].event == "end"
        r = client.render(job_id, 48, 36)
        assert r.content_type == "image/png" and r.checkpoint_step == TRAIN["steps"]
        assert Image.open(io.BytesIO(r.content)).size == (48, 36)
        assert job_id in [j["id"] for j in client.iter_jobs(status="succeeded")]
        assert client.viewer_url(job_id).endswith(f"/#job={job_id}")
        with pytest.raises(ApiError) as err:
            client.job(str(uuid.uuid4()))
        assert err.value.status_code == 404


SPLAT = {"steps": 30, "n_init_points": 800, "densify_from": 100, "n_test_renders": 0}


@pytest.mark.slow
def test_scene_job_export_path_and_files(fs_stack, tmp_path):
    """A small splat job through the CLI: submit --wait, export spz, the artifacts, the training
    cameras, an orbit GIF and the viewer's URL."""
    import gzip
    import zipfile

    from experiments.synthetic_scene import scene_files

    scene = tmp_path / "scene.zip"
    with zipfile.ZipFile(scene, "w") as zf:
        for name, data in scene_files(32, 12, 1, seed=3).items():
            zf.writestr(name, data)
    url = fs_stack.base_url
    sub = nf(
        "submit", str(scene), "--kind", "splat", "--config", json.dumps(SPLAT), "--wait", url=url
    )
    assert sub.returncode == 0, sub.stderr + fs_stack.logs()
    job_id = sub.stdout.splitlines()[0].strip()
    assert f"job {job_id} succeeded" in sub.stdout

    out = tmp_path / "out" / "scene.spz"
    ex = nf("export", job_id, "spz", "--out", str(out), url=url)
    assert ex.returncode == 0, ex.stderr
    assert ex.stdout.strip() == str(out)
    (state,) = fs_stack.client.get(f"/v1/jobs/{job_id}/exports").json()["items"]
    assert state["status"] == "succeeded" and out.stat().st_size == state["size"]
    data = out.read_bytes()  # the spz magic, in the clear (version 4) or gzip'd (version 3)
    assert b"NGSP" in (data[:4], gzip.decompress(data)[:4] if data[:2] == b"\x1f\x8b" else b"")
    listed = nf("exports", job_id, url=url)
    assert listed.returncode == 0 and state["id"] in listed.stdout

    arts = nf("--json", "artifacts", job_id, url=url)
    names = [a["name"] for a in json.loads(arts.stdout)["items"]]
    assert state["artifact"] in names and "point_cloud.ply" in names
    ply = tmp_path / "gaussians.ply"
    dl = nf("download", job_id, "point_cloud.ply", "--out", str(ply), url=url)
    assert dl.returncode == 0 and ply.read_bytes().startswith(b"ply\n"), dl.stderr

    cams = tmp_path / "cams.json"
    cp = nf("camera-path", job_id, "--out", str(cams), url=url)
    assert cp.returncode == 0, cp.stderr
    assert len(json.loads(cams.read_text())["camera_path"]) == 12

    gif = tmp_path / "orbit.gif"
    p = nf(
        "path",
        job_id,
        "--orbit",
        "3,30,3",
        "--width",
        "24",
        "--height",
        "24",
        "--out",
        str(gif),
        url=url,
    )
    assert p.returncode == 0, p.stderr
    anim = Image.open(gif)
    assert anim.size == (24, 24) and anim.n_frames == 3

    op = nf("open", job_id, "--print", url=url)
    assert op.returncode == 0 and op.stdout.strip() == f"{url}/#job={job_id}"
