"""Leases (core/leases.py) on SQLite and PostgreSQL: of two processes claiming the same job's
train lease at once exactly one gets it; a lease whose holder on another host stopped renewing
is taken once it expires, not before, and counts a lost worker; a holder killed on this host
frees its lease at once; a holder is told when the lease is no longer surely its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from types import SimpleNamespace

import pytest
from sqlalchemy import update

from core import leases
from core.db.engine import session
from core.db.leases import TRAIN, Lease
from tests.support.databases import KINDS, database

CLAIMER = """
import sys, time
from types import SimpleNamespace
from core import leases
from core.db.engine import engine_for
url, job, start, hold = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
settings = SimpleNamespace(database_url=url, data_dir=".")
engine_for(settings).connect().close()  # connected before the start line
time.sleep(max(0.0, start - time.time()))
got = leases.claim(settings, "train", job, 30, job_id=job)
print("got" if got else "none", flush=True)
time.sleep(hold)  # still alive and holding while the other one tries
"""


@pytest.fixture(params=KINDS)
def settings(request, tmp_path):
    with database(request.param, tmp_path) as url:
        yield SimpleNamespace(database_url=url, data_dir=tmp_path)


def _claimer(settings, job: str, start: float, hold: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CLAIMER, settings.database_url, job, str(start), str(hold)],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_of_two_processes_claiming_at_once_exactly_one_trains(settings):
    for _ in range(2):
        job = str(uuid.uuid4())
        start = time.time() + 2.5  # both are up and connected by then
        procs = [_claimer(settings, job, start, 1.5) for _ in range(2)]
        answers = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
        assert answers == ["got", "none"], answers


def test_an_expired_lease_is_reclaimed_and_counts_a_lost_worker(settings):
    job = str(uuid.uuid4())
    elsewhere = "other-host/boot/ns:4242:abc"  # a holder this host cannot judge
    first = leases.claim(settings, TRAIN, job, 1.0, job_id=job, holder=elsewhere)
    assert first is not None and first.losses == 0 and first.deliveries == 1
    assert leases.claim(settings, TRAIN, job, 1.0, job_id=job) is None  # live, not ours to judge
    time.sleep(1.2)
    second = leases.claim(settings, TRAIN, job, 30, job_id=job)
    assert second is not None and second.deliveries == 2 and second.losses == 1
    assert not leases.renew(settings, first, 30)  # the old holder has lost it
    assert leases.renew(settings, second, 30)
    leases.release(settings, second)
    third = leases.claim(settings, TRAIN, job, 30, job_id=job)
    assert third is not None and third.losses == 1  # a delivery that ended is no loss


def test_a_holder_killed_on_this_host_frees_its_lease_at_once(settings):
    job = str(uuid.uuid4())
    holder = _claimer(settings, job, time.time(), 60)
    assert holder.stdout.readline().strip() == "got"
    assert leases.claim(settings, TRAIN, job, 30, job_id=job) is None
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    got = leases.claim(settings, TRAIN, job, 30, job_id=job)
    assert got is not None and got.losses == 1


def test_held_renews_while_the_body_runs(settings):
    job = str(uuid.uuid4())
    with leases.held(settings, TRAIN, job, 0.4, job_id=job) as mine:
        assert mine is not None
        time.sleep(1.0)  # past the first expiry: renewed meanwhile
        assert leases.claim(settings, TRAIN, job, 30, holder="other-host/b/n:1:x") is None
    after = leases.claim(settings, TRAIN, job, 30, job_id=job)
    assert after is not None and after.losses == 0


def test_held_says_lost_once_another_holder_has_the_lease(settings):
    job = str(uuid.uuid4())
    with leases.held(settings, TRAIN, job, 0.4, job_id=job) as mine:
        time.sleep(0.3)
        assert not mine.lost.is_set()  # renewed, still ours
        with session(settings) as s:  # what a claim elsewhere writes once the expiry passed
            s.execute(
                update(Lease)
                .where(Lease.kind == TRAIN, Lease.subject == job)
                .values(holder="other-host/b/n:1:x")
            )
        assert mine.lost.wait(2.0)


def test_held_says_lost_after_a_ttl_without_a_renewal(settings):
    """The database unreachable for a whole TTL: the lease may have run out and been taken."""
    job = str(uuid.uuid4())
    url = settings.database_url
    with leases.held(settings, TRAIN, job, 0.8, job_id=job) as mine:
        settings.database_url = "postgresql+psycopg://nobody@127.0.0.1:1/none"
        time.sleep(0.3)
        assert not mine.lost.is_set()  # failing, but for less than TTL - TTL/4 (0.6 s)
        assert mine.lost.wait(3.0)
        settings.database_url = url
