"""Reservations in transactions (issue 37): the reaper never removes a live upload, and an upload
whose reservation it did remove never becomes a job without an owner.
- the reaper judged a reservation stale, and the upload is made a job at that very moment: the
  job stays (the row is deleted only if still reserved and stale, judged again under its lock);
- an API process (another process, an in-process client of the real app) stalls between its
  intake and making the job while the reaper (this process) removes the reservation: the
  upload is refused (410), no job without an owner is left;
- an upload through the real API whose body pauses for longer than STALE_UPLOAD_S while the
  reaper (this process) runs rounds with the same STALE_UPLOAD_S: never removed, and answered
  202 with its owner (the API keeps the row fresh while it reads the body)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import select, text

from core.db.engine import session
from core.db.jobs import RESERVED, JobRow
from core.settings import Settings
from core.storage import LocalStorage
from core.store import JobStore
from service.auth import ApiKey
from service.quotas import Quotas
from tests.support.stack import TEST_KEY, png_bytes
from worker import reaper

BOUNDARY = "nf-test-boundary-race"


def _backdate(store: JobStore, job_id: str, root, seconds: float = 7200) -> None:
    """Make the reservation look abandoned `seconds` ago: its row and its files."""
    with session(engine=store.engine) as s:
        row = s.get(JobRow, job_id)
        row.updated_at = row.updated_at.__class__.fromtimestamp(
            time.time() - seconds, row.updated_at.tzinfo
        )
    old = time.time() - seconds
    for path in [root, *root.rglob("*")]:
        os.utime(path, (old, old))


def _reserved(store: JobStore) -> list[JobRow]:
    with session(engine=store.engine) as s:
        return list(s.scalars(select(JobRow).where(JobRow.status == RESERVED)))


def test_a_reservation_made_a_job_while_the_reaper_judges_it_is_kept(db_url, tmp_path, monkeypatch):
    data = tmp_path / "data"
    settings = Settings(data_dir=data, database_url=db_url, stale_upload_s=60)
    storage = LocalStorage(data)
    store = JobStore(storage, url=db_url)
    key = ApiKey("k-race", "race")
    job_id, paths, _ = Quotas(storage, store, settings).admit(key)
    (paths.root / "dataset").mkdir()
    (paths.root / "dataset" / "photo.png").write_bytes(png_bytes())
    _backdate(store, job_id, paths.root)
    made = []

    def made_a_job_meanwhile(root):
        # The reaper looks at the upload's folder: at that moment the upload becomes a job.
        made.append(store.create(job_id, "image", {}, {"files": 1}))
        return time.time() - 7200  # the files, untouched for ages

    monkeypatch.setattr(reaper, "_newest_mtime", made_a_job_meanwhile)
    assert reaper.remove_stale_reservations(store, settings) == []
    assert made, "the reaper never looked at the reservation"
    assert store.get(job_id).status.value == "queued"
    assert store.owner_of(job_id) == key.id
    assert (paths.root / "dataset" / "photo.png").is_file()


# The API process: the real app, in-process client; it stalls after storing its intake's output
# (before making the job) until the reaper host says go.
API_HOST = """
import json, sys
from service.api import job_intake

real = job_intake.store_intake


def stalls(*args, **kwargs):
    real(*args, **kwargs)
    print("stalled", flush=True)
    sys.stdin.readline()


job_intake.store_intake = stalls
from fastapi.testclient import TestClient
from service.app import app
from tests.support.stack import png_bytes

with TestClient(app) as client:
    r = client.post(
        "/v1/jobs",
        headers={"Authorization": "Bearer " + sys.argv[1]},
        data={"kind": "image"},
        files={"dataset": ("photo.png", png_bytes(), "image/png")},
    )
print(json.dumps({"status": r.status_code, "body": r.json()}), flush=True)
"""


def test_an_upload_whose_reservation_was_removed_is_not_made_a_job(pg_url, tmp_path):
    from core.db.migrate import upgrade_url

    upgrade_url(pg_url)
    data = tmp_path / "data"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "API_KEYS_FILE")},
        "DATA_DIR": str(data),
        "DATABASE_URL": pg_url,
        "API_KEYS": f"test:{TEST_KEY}",
        "STALE_UPLOAD_S": "3600",
    }
    api = subprocess.Popen(
        [sys.executable, "-c", API_HOST, TEST_KEY],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        for line in api.stdout:
            lines.append(line)
            if line.strip() == "stalled":
                break
        else:
            raise AssertionError("the API never reached its stall:\n" + "".join(lines))
        store = JobStore(LocalStorage(data), url=pg_url)
        (row,) = _reserved(store)
        owner = row.owner
        assert owner
        # The API stalled for two hours (a hung disk, a stopped VM): the reaper finds it so.
        _backdate(store, row.id, data / "jobs" / row.id)
        settings = Settings(data_dir=data, database_url=pg_url, stale_upload_s=3600)
        assert reaper.remove_stale_reservations(store, settings) == [row.id]
        out, _ = api.communicate("go\n", timeout=120)
    finally:
        if api.poll() is None:
            api.kill()
    answer = json.loads(out.strip().splitlines()[-1])
    with session(engine=store.engine) as s:
        left = s.execute(
            text("SELECT status, owner FROM jobs WHERE id = :id"), {"id": row.id}
        ).all()
    assert left == [], f"a job without its reservation: {left} (answer {answer})"
    assert answer["status"] == 410, answer
    assert "STALE_UPLOAD_S" in answer["body"]["detail"]


def _paused_body(photo: bytes, release: threading.Event):
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="kind"\r\n\r\nimage\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="dataset"; '
        f'filename="photo.png"\r\nContent-Type: image/png\r\n\r\n'
    ).encode()
    half = len(photo) // 2
    yield head + photo[:half]
    assert release.wait(60)
    yield photo[half:] + f"\r\n--{BOUNDARY}--\r\n".encode()


@pytest.mark.slow
def test_a_slow_upload_is_never_reaped(stack_factory, pg_url):
    from core.db.migrate import upgrade_url

    upgrade_url(pg_url)
    stale_s = 2.0
    stack = stack_factory(queues=None, env={"DATABASE_URL": pg_url, "STALE_UPLOAD_S": "2"})
    photo = png_bytes(256, 256)
    release, answer = threading.Event(), {}

    def post():
        answer["r"] = stack.client.post(
            "/v1/jobs",
            content=_paused_body(photo, release),
            headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
        )

    t = threading.Thread(target=post)
    t.start()
    removed: list[str] = []
    try:
        store = stack.store()
        deadline = time.monotonic() + 20
        while not _reserved(store):
            assert time.monotonic() < deadline, stack.logs()
            time.sleep(0.05)
        (row,) = _reserved(store)
        # The client sends nothing for twice STALE_UPLOAD_S; the reaper (another host) runs.
        settings = Settings(data_dir=stack.data_dir, database_url=pg_url, stale_upload_s=stale_s)
        end = time.monotonic() + 2 * stale_s + 1
        while time.monotonic() < end:
            removed += reaper.remove_stale_reservations(store, settings)
            time.sleep(0.3)
    finally:
        release.set()
        t.join(60)
    assert removed == [], "the reaper removed an upload being sent"
    r = answer["r"]
    assert r.status_code == 202, r.text
    assert r.json()["id"] == row.id
    assert stack.store().owner_of(row.id) == row.owner
