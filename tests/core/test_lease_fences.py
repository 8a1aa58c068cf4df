"""Leases as fences (issue 37), reproduced on a real PostgreSQL with two processes standing for
two hosts:
- a claimant whose clock runs ahead of the holder's (or a holder whose clock runs behind) does
  not take a lease its holder still renews: expiries are the database's clock;
- a holder that lost its lease (another holder claimed it once it ran out) has every job,
  export and render-job write refused, the checkpoint pointer's check included, and is told;
- a renewal call hanging behind a relay that stopped relaying still ends in `lost`, set before
  another host can claim the lease, and leaving the block does not hang on it;
- database calls are bounded: a statement waiting on a lock, a connect to a server that never
  answers."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from types import SimpleNamespace

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.engine import make_url

from api_schemas.exports import ExportFormat, ExportStatus
from api_schemas.jobs import JobStatus, Progress
from core import leases, path_jobs
from core.db import engine as db_engine
from core.db.engine import engine_for_url, session
from core.db.jobs import JobEventRow, JobRow
from core.db.leases import RENDER, TRAIN, Lease
from core.exports import ExportStore
from core.settings import Settings
from core.storage import LocalStorage
from core.store import JobStore
from tests.support.databases import KINDS, database
from tests.support.tcp_proxy import Relay

HOST_A = "host-a/boot/ns:4242:aaaa"  # holders this host cannot judge alive or dead
HOST_B = "host-b/boot/ns:4343:bbbb"

# A claim made from a host whose clock is `skew` seconds off (the claim's own process: what
# the lease code would read as "now" there).
SKEWED_CLAIM = """
import sys
from datetime import timedelta
from types import SimpleNamespace
from core import leases
url, job, skew, ttl, holder = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
real = leases.utcnow
leases.utcnow = lambda: real() + timedelta(seconds=skew)
settings = SimpleNamespace(database_url=url, data_dir=".")
got = leases.claim(settings, "train", job, ttl, job_id=job, holder=holder)
print("got" if got else "none", flush=True)
"""

# Another host claiming the lease as soon as it can; prints the wall time it got it.
CLAIM_LOOP = """
import sys, time
from types import SimpleNamespace
from core import leases
url, job, for_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
settings = SimpleNamespace(database_url=url, data_dir=".")
end = time.time() + for_s
while time.time() < end:
    if leases.claim(settings, "train", job, 30, job_id=job, holder="host-b/boot/ns:1:bbbb"):
        print(repr(time.time()), flush=True)
        break
    time.sleep(0.05)
else:
    print("never", flush=True)
"""


def _skewed_claim(url: str, job: str, skew: float, ttl: float, holder: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", SKEWED_CLAIM, url, job, str(skew), str(ttl), holder],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def pg(tmp_path):
    with database("postgresql", tmp_path) as url:
        yield SimpleNamespace(database_url=url, data_dir=tmp_path)


@pytest.fixture(params=KINDS)
def settings(request, tmp_path):
    with database(request.param, tmp_path) as url:
        yield SimpleNamespace(database_url=url, data_dir=tmp_path)


def test_a_claimant_whose_clock_runs_ahead_cannot_take_a_renewed_lease(pg):
    """Host B's clock is 61 s ahead: A's lease (TTL 60 s, renewed just now) is not B's."""
    job = str(uuid.uuid4())
    assert leases.claim(pg, TRAIN, job, 60, job_id=job, holder=HOST_A) is not None
    assert _skewed_claim(pg.database_url, job, 61, 60, HOST_B) == "none"


def test_a_holder_whose_clock_runs_behind_keeps_its_lease(pg):
    """Host A's clock is 61 s behind when it claims (TTL 60 s): B, on time, does not take it."""
    job = str(uuid.uuid4())
    assert _skewed_claim(pg.database_url, job, -61, 60, HOST_A) == "got"
    assert leases.claim(pg, TRAIN, job, 60, job_id=job, holder=HOST_B) is None


def _events(store: JobStore, job_id: str) -> int:
    with session(engine=store.engine) as s:
        return len(s.scalars(select(JobEventRow.seq).where(JobEventRow.job_id == job_id)).all())


def test_a_stale_holders_writes_are_refused_once_another_holds_the_lease(settings, tmp_path):
    store = JobStore(LocalStorage(tmp_path / "data"), url=settings.database_url)
    job = str(uuid.uuid4())
    store.create(job, "image", {}, {}, owner="k-fence")
    a = leases.claim(settings, TRAIN, job, 0.5, job_id=job, holder=HOST_A)
    as_a = store.fenced(a)
    as_a.set_status(job, JobStatus.running)  # A holds it: accepted
    as_a.set_progress(job, Progress(step=1, total_steps=10))
    as_a.confirm(job)
    time.sleep(0.7)  # A's renewals stalled past its TTL
    b = leases.claim(settings, TRAIN, job, 30, job_id=job, holder=HOST_B)
    assert b is not None and b.losses == 1
    n = _events(store, job)
    for write in (
        lambda: as_a.set_status(
            job, JobStatus.succeeded, metrics={"psnr": 1.0}, only_from={JobStatus.running}
        ),
        lambda: as_a.set_progress(job, Progress(step=9, total_steps=10)),
        lambda: as_a.update(job, lambda j: j),
        lambda: as_a.confirm(job),  # what a checkpoint's pointer waits for
    ):
        with pytest.raises(leases.LeaseLost):
            write()
    assert a.lost.is_set()
    seen = store.get(job)
    assert seen.status == JobStatus.running and seen.metrics == {} and seen.progress.step == 1
    assert _events(store, job) == n  # no event written either
    store.fenced(b).set_status(job, JobStatus.succeeded, metrics={"psnr": 2.0})
    assert store.get(job).metrics == {"psnr": 2.0}


def _take_over(settings, kind: str, subject: str) -> None:
    """What another host's claim writes once the holder's expiry passed."""
    with session(settings) as s:
        s.execute(
            update(Lease).where(Lease.kind == kind, Lease.subject == subject).values(holder=HOST_B)
        )


def test_export_and_render_job_writes_are_fenced(settings, tmp_path):
    settings = Settings(data_dir=tmp_path / "data", database_url=settings.database_url)
    storage = LocalStorage(tmp_path / "data")
    store = JobStore(storage, url=settings.database_url)
    job = str(uuid.uuid4())
    store.create(job, "splat", {}, {}, owner="k-fence")
    exports = ExportStore(storage, settings=settings)
    export, _ = exports.create_or_get(job, ExportFormat.ply, {})
    with exports.running(job, export.id, ttl_s=30) as claim:
        exports.update(job, export.id, status=ExportStatus.running)
        _take_over(settings, "export", f"{job}/{export.id}")
        with pytest.raises(leases.LeaseLost):
            exports.update(job, export.id, status=ExportStatus.succeeded, artifact="mesh.ply")
        assert claim.lost.is_set()
    assert exports.get(job, export.id).status.value == "running"

    render_id = path_jobs.new_id()
    path_jobs.create(job, render_id, job, "mp4", 3, settings=settings)
    with path_jobs.running(job, render_id, settings=settings) as claim:
        path_jobs.update(job, render_id, settings=settings, fence=claim, status="running")
        _take_over(settings, RENDER, render_id)
        with pytest.raises(leases.LeaseLost):
            path_jobs.update(
                job, render_id, settings=settings, fence=claim, status="succeeded", artifact="x"
            )
    state = path_jobs.read(job, render_id, settings=settings)
    assert state["status"] == "running" and state["artifact"] is None


def _via(url: str, relay: Relay) -> str:
    u = make_url(url)
    return u.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)


@pytest.mark.slow
def test_a_hanging_renewal_sets_lost_before_another_host_can_claim(pg):
    """Holder A reaches the database through a relay that stops relaying (a proxy gone quiet):
    its renewal call hangs. Its watchdog sets `lost` by the last renewal + TTL - TTL/4; host B
    (another process, reaching the database directly) claims only after the lease's expiry,
    by then A knows. Leaving A's block does not wait for the hung calls."""
    u = make_url(pg.database_url)
    relay = Relay((u.host, u.port or 5432))
    a = SimpleNamespace(database_url=_via(pg.database_url, relay), data_dir=pg.data_dir)
    job, ttl = str(uuid.uuid4()), 2.0
    try:
        with leases.held(a, TRAIN, job, ttl, job_id=job) as mine:
            assert mine is not None
            time.sleep(0.7)  # a renewal or two went through
            assert not mine.lost.is_set()
            relay.pause()
            paused = time.monotonic()
            b = subprocess.Popen(
                [sys.executable, "-c", CLAIM_LOOP, pg.database_url, job, "20"],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert mine.lost.wait(ttl + 1), "the holder was never told its lease may be gone"
            lost_at = time.time()
            assert time.monotonic() - paused <= ttl
            got = b.communicate(timeout=60)[0].strip()
            assert got != "never", "host B never got the lease"
            assert lost_at <= float(got), (lost_at, got)
            leaving = time.monotonic()
        assert time.monotonic() - leaving < 10  # the release is bounded too
    finally:
        relay.close()


def test_database_calls_are_bounded(pg, monkeypatch):
    url = pg.database_url
    monkeypatch.setattr(db_engine, "PG_STATEMENT_TIMEOUT_MS", 1000, raising=False)
    monkeypatch.setattr(db_engine, "PG_CONNECT_TIMEOUT_S", 1, raising=False)
    short = f"{url}?application_name=nf-bounded"  # a new engine, made with those limits
    store = JobStore(LocalStorage(pg.data_dir / "data"), url=short)
    job = str(uuid.uuid4())
    store.create(job, "image", {}, {}, owner="k-bounded")

    def bounded(call, within_s: float) -> BaseException | None:
        done: list = []

        def run() -> None:
            try:
                call()
                done.append(None)
            except BaseException as exc:  # noqa: BLE001  (what ended the call is the answer)
                done.append(exc)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(within_s)
        assert done, f"the call was still waiting after {within_s} s"
        return done[0]

    # A statement waiting on a lock another session holds (a host that hung mid-transaction).
    holder = engine_for_url(url).connect()
    try:
        holder.execute(select(JobRow.id).where(JobRow.id == job).with_for_update())
        err = bounded(lambda: store.set_status(job, JobStatus.running), 8)
        assert err is not None and "statement timeout" in str(err)
    finally:
        holder.rollback()
        holder.close()
    # A server that accepts the connection and never answers (a relay gone quiet).
    relay = Relay((make_url(url).host, make_url(url).port or 5432))
    relay.pause()
    try:
        err = bounded(lambda: engine_for_url(_via(short, relay)).connect().close(), 8)
        assert err is not None and "timeout" in str(err).lower()
    finally:
        relay.close()
    # What every connection gets by default (the URL's own parameters would win).
    with session(engine=engine_for_url(url)) as s:
        assert s.scalar(text("SHOW statement_timeout")) == "30s"
        assert s.scalar(text("SHOW idle_in_transaction_session_timeout")) == "1min"
        params = s.connection().connection.dbapi_connection.info.get_parameters()
        assert params.get("tcp_user_timeout") == "20000"
        assert params.get("connect_timeout") == "10"
