"""Claiming, renewing and releasing leases (core/db/leases.py), for any number of hosts.

A claim is one transaction that locks the lease row (`SELECT ... FOR UPDATE`; SQLite's write
lock) and takes it when nobody holds it, its holder's expiry has passed, or its holder is a
process of this very host that no longer exists (a SIGKILLed worker need not wait out its TTL
for its redelivered message to be taken). Holders renew the expiry every TTL / 4 from a thread.
Expiries are written and judged with the database's clock (core.db.engine.db_now), never a
host's: a claimant whose clock runs ahead cannot take a lease early.

The holder name is a token of one claim (one delivery of the work): writes made on the work's
behalf check it in their own transaction (`fence`: the lease row still names this holder, read
under a lock a claim must wait for), so a holder that lost its lease cannot write any more once
another holder has it. `held` also runs a watchdog that sets the claim's `lost` at the last
successful renewal + TTL - TTL/4 by this host's monotonic clock, whatever the renewal call is
doing (a call hanging behind a dead proxy included): before anybody else can claim the lease.
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
from typing import TypeVar

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from core import retry
from core.db.engine import db_now, insert_if_missing, session
from core.db.leases import Lease

log = logging.getLogger(__name__)
T = TypeVar("T")


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
class LeaseLost(Exception):
    """The lease is no longer this holder's (or could not be confirmed in time): the work
    stops, and leaves what it would have written to the lease's new holder."""


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


def fenced(claim: Claim | None, fn: Callable[[], T], what: str, deadline_s: float = 300.0) -> T:
    """`retry.retrying` for a write made under a lease's `claim` (None: a plain `retrying`):
    tries stop once the claim is lost (LeaseLost), which its watchdog sets when renewals fail
    too."""
    if claim is None:
        return retry.retrying(fn, what, deadline_s=deadline_s)
    return retry.retrying(
        fn,
        what,
        stop=claim.lost.is_set,
        on_stop=lambda: LeaseLost(f"the {claim.kind} lease of {claim.subject} was lost"),
        deadline_s=deadline_s,
    )


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
        now = db_now(s)
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
            .values(expires_at=db_now(s) + timedelta(seconds=ttl_s))
        ).rowcount
    return n == 1


def fence(s: Session, claim_: Claim | None) -> None:
    """Inside a write's own transaction: raise LeaseLost (and set the claim's `lost`) unless the
    lease still names `claim_`'s holder. The row is read under a lock (FOR SHARE on PostgreSQL;
    SQLite's write lock is held from BEGIN), so a claim taking it over waits for this
    transaction to end, or this one sees the new holder. None: an unfenced write."""
    if claim_ is None:
        return
    holder = s.execute(
        select(Lease.holder)
        .where(Lease.kind == claim_.kind, Lease.subject == claim_.subject)
        .with_for_update(read=True)
    ).scalar_one_or_none()
    if holder != claim_.holder:
        claim_.lost.set()
        raise LeaseLost(f"the {claim_.kind} lease of {claim_.subject} is another holder's")


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


def _bounded(fn: Callable[[], None], timeout_s: float, what: str) -> None:
    """Run `fn` in a thread for at most `timeout_s` (a call to an unreachable database may
    hang until its TCP timeout); left running past that, it is logged and abandoned."""
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        except Exception:
            log.warning("%s failed", what, exc_info=True)
        finally:
            done.set()

    threading.Thread(target=run, name=what[:15], daemon=True).start()
    if not done.wait(timeout_s):
        log.warning("%s did not finish in %.0f s; left behind", what, timeout_s)


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
    the lease. The claim's `lost` is set once the lease is another holder's, or by the watchdog
    at the last successful renewal + TTL - TTL/4 (this host's monotonic clock, from the moment
    that renewal was sent: the database's expiry is no earlier), even while a renewal call
    hangs; the body is expected to check it and stop, and its fenced writes are refused once
    another holder has the lease. A process killed inside the body releases nothing: its lease
    runs out, or is found dead by a claimant on this machine (a moment after the kill, once
    its parent has reaped it: hence `wait_s` for redelivered work)."""
    deadline = time.monotonic() + wait_s
    while True:
        sent = time.monotonic()
        got = claim(settings, kind, subject, ttl_s, job_id=job_id, count=count)
        if got is not None or time.monotonic() >= deadline or (give_up and give_up()):
            break
        time.sleep(0.2)
    if got is None:
        yield None
        return
    stop = threading.Event()
    margin = ttl_s / 4
    renewed = [sent]  # when the last successful renewal (or the claim) was sent

    def renewing() -> None:
        while not stop.wait(ttl_s / 4) and not got.lost.is_set():
            started = time.monotonic()
            try:
                mine = renew(settings, got, ttl_s)
            except Exception:
                log.warning("lease %s/%s renewal failed", kind, subject, exc_info=True)
                continue
            if not mine:
                log.error("lease %s/%s was taken over by another holder", kind, subject)
                got.lost.set()
                return
            if not got.lost.is_set():
                renewed[0] = started

    def watchdog() -> None:
        while not got.lost.is_set():
            left = renewed[0] + ttl_s - margin - time.monotonic()
            if left <= 0:
                log.error(
                    "lease %s/%s not renewed for %.1f s (its TTL %.0f s less a margin of "
                    "%.1f s): another holder may have it soon; giving it up",
                    kind,
                    subject,
                    time.monotonic() - renewed[0],
                    ttl_s,
                    margin,
                )
                got.lost.set()
                return
            if stop.wait(left):
                return

    threads = [
        threading.Thread(target=fn, name=f"lease-{name}-{subject[:8]}", daemon=True)
        for name, fn in (("renew", renewing), ("watch", watchdog))
    ]
    for thread in threads:
        thread.start()
    try:
        yield got
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=1)
        # Retried through transient errors for up to a TTL (in the background past the wait):
        # a release that never lands leaves the delivery open, which the next one counts as a
        # lost worker.
        _bounded(
            lambda: retry.retrying(
                lambda: release(settings, got, close=count),
                f"releasing lease {kind}/{subject}",
                deadline_s=ttl_s,
            ),
            max(ttl_s / 4, 5.0),
            f"lease {kind}/{subject} release",
        )
