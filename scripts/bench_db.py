"""Job state at scale on PostgreSQL (issue 27): `GET /v1/jobs` latency over real HTTP and one
reaper round's time, with N jobs in the database, printed as a table.

    .venv/bin/python scripts/bench_db.py [--jobs 100000] [--requests 300]

Makes its own database on PG_ADMIN (default postgresql://postgres@127.0.0.1:5432/postgres),
starts the API against it (tests/support/stack.py, no worker), inserts the jobs straight into
the table (most finished, a few queued and running, spread over the bench key and 20 others),
then times: the first page, pages deep in the key's history reached by cursor, a status filter,
and a reaper round (worker/reaper.py: stranded jobs, exports and renders, stale reservations)
at 1% and at 100% of the jobs, to show the round does not grow with finished jobs.
Not a test: the numbers depend on the machine; run it on a quiet one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from core.db.engine import engine_for_url  # noqa: E402
from core.db.jobs import JobRow  # noqa: E402
from core.settings import Settings  # noqa: E402
from core.storage import LocalStorage  # noqa: E402
from core.store import JobStore  # noqa: E402
from service.auth import id_secret, key_id  # noqa: E402
from tests.support.databases import postgres_database  # noqa: E402
from tests.support.stack import TEST_KEY, new_stack  # noqa: E402

BATCH = 5000


def insert_jobs(url: str, owner: str, n: int, start: int = 0) -> None:
    """n jobs, one in ten of them the bench key's; 0.1% queued, 0.1% running, the rest done."""
    engine = engine_for_url(url)
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    others = [f"h-other{i:02d}" for i in range(20)]
    for lo in range(start, start + n, BATCH):
        rows = []
        for i in range(lo, min(lo + BATCH, start + n)):
            status = "queued" if i % 1000 == 1 else "running" if i % 1000 == 2 else "succeeded"
            at = t0 + timedelta(seconds=i)
            rows.append(
                {
                    "id": str(uuid.uuid4()),
                    "kind": "image",
                    "status": status,
                    "owner": owner if i % 10 == 0 else others[i % 20],
                    "created_at": at,
                    "updated_at": at,
                    "config": {"steps": 1000, "resolution": 64},
                    "dataset": {"file": "image.png", "width": 64, "height": 64},
                    "metrics": {"psnr": 30.0} if status == "succeeded" else {},
                    "progress": {"step": 1000, "total_steps": 1000},
                    "error": None,
                    "cancel_requested": False,
                    "last_seq": 3,
                }
            )
        with engine.begin() as conn:
            conn.execute(insert(JobRow), rows)


def percentiles(samples: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return q[49] * 1000, q[98] * 1000


def time_requests(client: httpx.Client, params_list: list[dict]) -> list[float]:
    out = []
    for params in params_list:
        t = time.perf_counter()
        r = client.get("/v1/jobs", params=params)
        out.append(time.perf_counter() - t)
        r.raise_for_status()
    return out


def reaper_round(url: str, data_dir: Path) -> float:
    from worker.reaper import (
        remove_stale_reservations,
        stranded_exports,
        stranded_jobs,
        stranded_renders,
    )

    settings = Settings(data_dir=data_dir, database_url=url, queued_grace_s=1e9)
    store = JobStore(LocalStorage(data_dir), url=url)
    t = time.perf_counter()
    in_broker: set[str] = set()
    stranded_jobs(settings, in_broker)
    stranded_exports(settings, in_broker)
    stranded_renders(settings, in_broker)
    remove_stale_reservations(store, settings)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args()
    rows: list[tuple[str, str]] = []
    with postgres_database() as url, tempfile.TemporaryDirectory() as tmp:
        stack = new_stack(Path(tmp), queues=None, env={"DATABASE_URL": url})
        try:
            owner = key_id(TEST_KEY, id_secret(Settings(data_dir=stack.data_dir)))
            small = max(1, args.jobs // 100)
            insert_jobs(url, owner, small)
            rounds = [reaper_round(url, stack.data_dir) for _ in range(5)]
            rows.append((f"reaper round, {small} jobs", f"{min(rounds) * 1000:.1f} ms"))
            t = time.perf_counter()
            insert_jobs(url, owner, args.jobs - small, start=small)
            rows.append((f"insert {args.jobs - small} jobs", f"{time.perf_counter() - t:.1f} s"))
            # What autovacuum does soon after a bulk load (index-only counts need its map).
            autocommit = engine_for_url(url).execution_options(isolation_level="AUTOCOMMIT")
            with autocommit.connect() as conn:
                conn.exec_driver_sql("VACUUM ANALYZE jobs")
            rounds = [reaper_round(url, stack.data_dir) for _ in range(5)]
            rows.append((f"reaper round, {args.jobs} jobs", f"{min(rounds) * 1000:.1f} ms"))

            with httpx.Client(base_url=stack.base_url, headers=stack.headers, timeout=30) as c:
                n = args.requests
                time_requests(c, [{"limit": 50}] * 20)  # warm the API and the pool
                first = time_requests(c, [{"limit": 50}] * n)
                # Cursors spread over the key's whole history: deep pages cost the same.
                cursors, cursor = [], None
                while True:
                    page = c.get("/v1/jobs", params={"limit": 100, "cursor": cursor or ""}).json()
                    cursor = page["next_cursor"]
                    if cursor is None:
                        break
                    cursors.append(cursor)
                picks = [cursors[i * len(cursors) // n] for i in range(n)] if cursors else []
                deep = time_requests(c, [{"limit": 50, "cursor": k} for k in picks])
                running = time_requests(c, [{"limit": 50, "status": "running"}] * n)
                total = c.get("/v1/jobs", params={"limit": 1}).json()["total"]
            for name, samples in (
                (f"GET /v1/jobs?limit=50 (key holds {total})", first),
                (f"GET /v1/jobs?limit=50&cursor=… ({len(cursors)} depths)", deep),
                ("GET /v1/jobs?limit=50&status=running", running),
            ):
                p50, p99 = percentiles(samples)
                rows.append((name, f"p50 {p50:.1f} ms · p99 {p99:.1f} ms"))
        finally:
            stack.stop()
    width = max(len(a) for a, _ in rows)
    print(f"| {'measure'.ljust(width)} | result |")
    print(f"|{'-' * (width + 2)}|--------|")
    for a, b in rows:
        print(f"| {a.ljust(width)} | {b} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
