"""What exports and render jobs write counts toward QUOTA_STORED_MB, through the real API and a
real worker, on SQLite and PostgreSQL: after an export, a frame render job and a path render job
of a tiny splat training finish, the job's recorded stored bytes (job_storage, core/usage.py)
have grown by each file's size; with the quota set between what the key stored before the last
of them and after it, the key's next upload is refused (413 naming QUOTA_STORED_MB)."""

from __future__ import annotations

import io
import time
import zipfile

import pytest
from sqlalchemy import select

from core.db.engine import session
from core.db.quotas import JobStorage
from tests.support.stack import png_bytes

pytestmark = pytest.mark.slow  # `make test-fast` leaves it out

CONFIG = {"steps": 20, "n_init_points": 300, "densify_from": 100, "n_test_renders": 0}
MB = 1024 * 1024
CAMERA = {"look_at": {"eye": [0.0, -3.0, 1.0], "target": [0.0, 0.0, 0.0], "up": [0, 0, 1]}}


def _scene_zip() -> bytes:
    from experiments.synthetic_scene import Scene, Sphere, scene_files

    scene = Scene([Sphere((0.3, -0.2, 0.1), 0.6, ((0.9, 0.2, 0.15), (0.2, 0.3, 0.9)), (8, 4))])
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in scene_files(32, 16, 1, seed=3, scene=scene).items():
            zf.writestr(name, data)
    return buf.getvalue()


def _recorded(stack, job_id: str) -> int | None:
    with session(engine=stack.store().engine) as s:
        return s.scalar(select(JobStorage.stored_bytes).where(JobStorage.job_id == job_id))


def _files_bytes(stack, job_id: str) -> int:
    return sum(p.stat().st_size for p in stack.job_dir(job_id).rglob("*") if p.is_file())


def _wait_recorded(stack, job_id: str, want: int, what: str, timeout: float = 15) -> None:
    """The worker records the bytes just after it marks the work finished: wait for them."""
    deadline = time.monotonic() + timeout
    while (got := _recorded(stack, job_id)) != want:
        assert time.monotonic() < deadline, f"{what}: recorded {got}, want {want}"
        time.sleep(0.1)


def _finished(stack, url: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while (state := stack.client.get(url).json())["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, f"stuck: {state}\n{stack.logs()}"
        time.sleep(0.2)
    assert state["status"] == "succeeded", f"{state}\n{stack.logs()}"
    return state


def test_exports_and_render_jobs_count_toward_the_stored_quota(stack_factory, db_url):
    stack = stack_factory(env={"DATABASE_URL": db_url})
    r = stack.submit(_scene_zip(), "scene.zip", "splat", CONFIG, "application/zip")
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    job = stack.wait_status(job_id, "succeeded", "failed", timeout=240)
    assert job["status"] == "succeeded", job["error"]
    _wait_recorded(stack, job_id, _files_bytes(stack, job_id), "training")
    stored = _recorded(stack, job_id)
    artifacts = stack.job_dir(job_id) / "artifacts"

    path = {"orbit": {"radius": 3.0, "n_frames": 3}, "width": 24, "height": 16, "mode": "job"}
    asks = [
        ("export", "exports", {"format": "gaussians"}),
        ("frame job", "render", {"width": 48, "height": 32, "mode": "job", "camera": CAMERA}),
        ("path job", "render/path", path),
    ]
    # One at a time, each checked before the next starts: a worker measures every file of the
    # job, so a later output's count would cover an earlier one that recorded nothing.
    for what, route, body in asks:
        r = stack.client.post(f"/v1/jobs/{job_id}/{route}", json=body)
        assert r.status_code == 202, r.text
        url = r.json()["url"] if what != "export" else f"/v1/jobs/{job_id}/exports/{r.json()['id']}"
        state = _finished(stack, url)
        size = (artifacts / state["artifact"]).stat().st_size
        assert size > 0
        before_last, stored = stored, stored + size
        _wait_recorded(stack, job_id, stored, what)
    assert stored == _files_bytes(stack, job_id)

    # A quota between what the key stored before its last output and after it: that output
    # alone takes the key past it, and the next upload is refused.
    cap_mb = (before_last + (stored - before_last) / 2) / MB
    stack.stop_api()
    stack.env["QUOTA_STORED_MB"] = f"{cap_mb:.9f}"
    stack.start_api()
    r = stack.submit(png_bytes(), "photo.png", "image")
    assert r.status_code == 413 and "QUOTA_STORED_MB" in r.json()["detail"], r.text
