"""Claiming, renewing and releasing leases (core/db/leases.py), for any number of hosts.

A claim is one transaction that locks the lease row (`SELECT ... FOR UPDATE`; SQLite's write
lock) and takes it when nobody holds it, its holder's expiry has passed, or its holder is a
process of this very host that no longer exists (a SIGKILLed worker need not wait out its TTL
for its redelivered message to be taken). Holders renew the expiry every TTL / 4 from a thread.
Expiries are the claiming host's clock: hosts are assumed NTP-synchronised, well within a TTL.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from core.db.engine import insert_if_missing, session
from core.db.leases import Lease

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


# -- who holds it -----------------------------------------------------------------------------
def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return "-"


def _pid_ns() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "-"


def _machine() -> str:
    """This host, boot and pid namespace: pids compare only within the same one."""
    return f"{socket.gethostname()}/{_boot_id()}/{_pid_ns()}"


def new_holder() -> str:
    """A holder name for one claim: `<host>/<boot>/<pid ns>:<pid>:<random>`."""
    return f"{_machine()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")  # a killed child its parent has not reaped yet
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder_gone(holder: str) -> bool:
    """True when `holder` is a process of this machine that has died; a holder elsewhere is
    never judged here (its expiry decides)."""
    try:
        machine, pid, _token = holder.rsplit(":", 2)
        pid_n = int(pid)
    except ValueError:
        return False
    return machine == _machine() and pid_n != os.getpid() and not _alive(pid_n)


def free(lease: Lease | None, now: datetime | None = None, *, local: bool = True) -> bool:
    """Nobody holds it, its expiry has passed, or (`local`) its holder died on this machine."""
    if lease is None or lease.holder is None:
        return True
    if lease.expires_at is None or lease.expires_at <= (now or utcnow()):
        return True
    return local and holder_gone(lease.holder)


# -- claims -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Claim:
    kind: str
    subject: str
    holder: str
    deliveries: int
    losses: int  # deliveries that ended with their worker dead, this one not counted
    # Set by `held` when the lease stopped being this holder's (taken over), or could not be
    # renewed for a whole TTL (so another host may have taken it): the body should stop.
    lost: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)


def _ensure_row(s: Session, kind: str, subject: str, job_id: str | None) -> None:
    insert_if_missing(
        s, Lease, kind=kind, subject=subject, job_id=job_id, deliveries=0, losses=0, open=False
    )


def locked(s: Session, kind: str, subject: str, job_id: str | None = None) -> Lease:
    """The lease row, created if missing, locked for the rest of the transaction."""
    _ensure_row(s, kind, subject, job_id)
    return s.execute(
        select(Lease).where(Lease.kind == kind, Lease.subject == subject).with_for_update()
    ).scalar_one()


def claim(
    settings,
    kind: str,
    subject: str,
    ttl_s: float,
    *,
    job_id: str | None = None,
    count: bool = True,
    holder: str | None = None,
) -> Claim | None:
    """Take the lease, or None while another live holder has it. A counted claim (a delivery of
    the work) adds a loss when the previous counted delivery never ended."""
    holder = holder or new_holder()
    with session(settings, write=True) as s:
        row = locked(s, kind, subject, job_id)
        now = utcnow()
        if not free(row, now):
            return None
        if count:
            if row.open:
                row.losses += 1
            row.deliveries += 1
            row.open = True
        row.holder, row.expires_at = holder, now + timedelta(seconds=ttl_s)
        return Claim(kind, subject, holder, row.deliveries, row.losses)


def renew(settings, claim_: Claim, ttl_s: float) -> bool:
    """Push the expiry on; False when the lease is no longer this holder's."""
    with session(settings) as s:
        n = s.execute(
            update(Lease)
            .where(
                Lease.kind == claim_.kind,
                Lease.subject == claim_.subject,
                Lease.holder == claim_.holder,
            )
            .values(expires_at=utcnow() + timedelta(seconds=ttl_s))
        ).rowcount
    return n == 1


def release(settings, claim_: Claim, *, close: bool = True) -> None:
    """Give the lease up; `close` ends the counted delivery (it did not lose its worker)."""
    values: dict = {"holder": None, "expires_at": None}
    if close:
        values["open"] = False
    with session(settings) as s:
        s.execute(
            update(Lease)
            .where(
                Lease.kind == claim_.kind,
                Lease.subject == claim_.subject,
                Lease.holder == claim_.holder,
            )
            .values(**values)
        )


def reset(settings, kind: str, subject: str) -> None:
    """Forget the counts (work asked for afresh, e.g. a failed export requested again)."""
    with session(settings) as s:
        s.execute(delete(Lease).where(Lease.kind == kind, Lease.subject == subject))


def forget_job(s: Session, job_id: str) -> None:
    """Remove every lease of a deleted job (inside the caller's transaction)."""
    s.execute(delete(Lease).where(Lease.job_id == job_id))


@contextmanager
def held(
    settings,
    kind: str,
    subject: str,
    ttl_s: float,
    *,
    job_id: str | None = None,
    count: bool = True,
    wait_s: float = 0.0,
    give_up: Callable[[], bool] | None = None,
) -> Iterator[Claim | None]:
    """Claim (trying again for up to `wait_s`, unless `give_up()`), renew every TTL / 4 while
    the body runs, release after it. Yields None (and runs the body) when another holder has
    the lease. The claim's `lost` is set once the lease is another holder's, or renewals have
    failed for a whole TTL (the database unreachable: the lease may have run out and been
    taken elsewhere); the body is expected to check it and stop. A process killed inside the
    body releases nothing: its lease runs out, or is found dead by a claimant on this machine
    (a moment after the kill, once its parent has reaped it: hence `wait_s` for redelivered
    work)."""
    deadline = time.monotonic() + wait_s
    while True:
        got = claim(settings, kind, subject, ttl_s, job_id=job_id, count=count)
        if got is not None or time.monotonic() >= deadline or (give_up and give_up()):
            break
        time.sleep(0.2)
    if got is None:
        yield None
        return
    stop = threading.Event()

    def renewing() -> None:
        renewed = time.monotonic()
        while not stop.wait(ttl_s / 4):
            try:
                if not renew(settings, got, ttl_s):
                    log.error("lease %s/%s was taken over by another holder", kind, subject)
                    got.lost.set()
                    return
                renewed = time.monotonic()
            except Exception:
                log.warning("lease %s/%s renewal failed", kind, subject, exc_info=True)
                if time.monotonic() - renewed >= ttl_s:
                    log.error(
                        "lease %s/%s not renewed for %.0f s (its TTL): another holder may have "
                        "it; giving it up",
                        kind,
                        subject,
                        ttl_s,
                    )
                    got.lost.set()
                    return

    thread = threading.Thread(target=renewing, name=f"lease-{kind}-{subject[:8]}", daemon=True)
    thread.start()
    try:
        yield got
    finally:
        stop.set()
        thread.join(timeout=5)
        try:
            release(settings, got, close=count)
        except Exception:
            log.warning("could not release lease %s/%s", kind, subject, exc_info=True)
