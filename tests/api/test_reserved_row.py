"""A job's row is committed before any file of it exists, on SQLite and PostgreSQL: an
admission whose row cannot be written leaves no folder; an upload held mid-way through the real
API has its `reserved` row (owned by its key) while its file is being written; and a reaper
round removes no job whose 202 was answered, however old it counts reservations."""

from __future__ import annotations

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
from tests.support.stack import png_bytes
from worker import reaper

BOUNDARY = "nf-test-boundary-7f3a"

REFUSE_JOBS = {
    "sqlite": [
        "CREATE TRIGGER refuse_jobs BEFORE INSERT ON jobs "
        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse_jobs() RETURNS trigger AS $$ BEGIN "
        "RAISE EXCEPTION 'refused by the test'; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER refuse_jobs BEFORE INSERT ON jobs "
        "FOR EACH ROW EXECUTE FUNCTION refuse_jobs()",
    ],
}


def test_an_admission_whose_row_is_not_written_makes_no_folder(db_url, tmp_path):
    """The folder is made only once the row is committed: a database refusing the row leaves
    no folder the reaper could not tell from an upload (nor remove by its row)."""
    data = tmp_path / "data"
    settings = Settings(data_dir=data, database_url=db_url)
    storage = LocalStorage(data)
    store = JobStore(storage, url=db_url)
    quotas = Quotas(storage, store, settings)
    kind = "postgresql" if db_url.startswith("postgresql") else "sqlite"
    with session(engine=store.engine, write=True) as s:
        for sql in REFUSE_JOBS[kind]:
            s.execute(text(sql))
    with pytest.raises(Exception, match="refused by the test"):
        quotas.admit(ApiKey("k-reserved", "reserved"))
    jobs = data / "jobs"
    assert not jobs.is_dir() or list(jobs.iterdir()) == []


def _held_body(photo: bytes, release: threading.Event):
    """A multipart body sending the form and half the photo, then waiting for `release`."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="kind"\r\n\r\nimage\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="dataset"; '
        f'filename="photo.png"\r\nContent-Type: image/png\r\n\r\n'
    ).encode()
    half = len(photo) // 2
    yield head + photo[:half]
    assert release.wait(60)
    yield photo[half:] + f"\r\n--{BOUNDARY}--\r\n".encode()


def _reserved(stack) -> list[JobRow]:
    with session(engine=stack.store().engine) as s:
        return list(s.scalars(select(JobRow).where(JobRow.status == RESERVED)))


def test_an_upload_has_its_row_while_written_and_a_202_job_is_never_reaped(stack_factory, db_url):
    stack = stack_factory(queues=None, env={"DATABASE_URL": db_url})
    photo = png_bytes(256, 256)
    release, answer = threading.Event(), {}

    def post():
        answer["r"] = stack.client.post(
            "/v1/jobs",
            content=_held_body(photo, release),
            headers={"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"},
        )

    t = threading.Thread(target=post)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while not (rows := _reserved(stack)):
            assert time.monotonic() < deadline, stack.logs()
            time.sleep(0.05)
        (row,) = rows
        upload = stack.job_dir(row.id) / "upload" / "photo.png"
        while not upload.is_file():
            assert time.monotonic() < deadline, stack.logs()
            time.sleep(0.05)
        # Mid-way: the file is being written, and its job's row is there, owned by the key.
        assert row.owner and row.kind is None
        assert [r.id for r in _reserved(stack)] == [row.id]
        assert upload.stat().st_size < len(photo)
        # A round that counts reservations stale after STALE_UPLOAD_S leaves a live one alone.
        settings = Settings(data_dir=stack.data_dir, database_url=db_url, stale_upload_s=3600)
        assert reaper.remove_stale_reservations(stack.store(), settings) == []
    finally:
        release.set()
        t.join(60)
    r = answer["r"]
    assert r.status_code == 202, r.text
    assert r.json()["id"] == row.id
    # Answered 202: no round removes it, even one counting every reservation stale at once.
    eager = Settings(data_dir=stack.data_dir, database_url=db_url, stale_upload_s=0.001)
    assert reaper.remove_stale_reservations(stack.store(), eager) == []
    reaper.stranded(eager)
    assert stack.store().get(row.id).status.value == "queued"
    assert any(p.is_file() for p in stack.job_dir(row.id).rglob("*"))  # its files kept too
    assert stack.client.get(f"/v1/jobs/{row.id}").status_code == 200
