"""Job state at scale on PostgreSQL: `GET /v1/jobs` latency and a reaper round's time.

    .venv/bin/python experiments/jobs_db_bench.py [--jobs 100000] [--small 1000]

Makes a database of its own on the PostgreSQL server at TEST_PG_ADMIN (default
postgresql://postgres@127.0.0.1:5432/postgres) and drops it at the end. It holds `--jobs` jobs
(COPY, migrated schema) spread over 500 keys as real tenants are (key i owns a share ~1/(i+1):
the largest ~15 %, the smallest a few dozen), 85 % succeeded / 10 % failed / 5 % cancelled over
a year, plus 200 unfinished ones (queued and running, no worker: the reaper's work). The API runs
as a uvicorn process on that database and answers three keys: the largest tenant, a middle one
and a small one. Measured through HTTP on one keep-alive connection:

- first pages (`?limit=50`) for each key; the largest key's first page filtered by status;
- the largest key's deep pages: its whole list walked by `next_cursor` (keyset), and for
  contrast `?offset=` pages as deep;
- the same queries as the server executes them (EXPLAIN ANALYZE), to tell the database's
  share from HTTP, JSON and Python's;
- reaper rounds (worker/reaper.py `reap`, filesystem broker) on this database and on one with
  `--small` finished jobs and the same number of unfinished ones: the first round (which
  re-sends what nobody holds) and the `--rounds` rounds after it, alternating between the two
  databases.

Prints a markdown table (docs/deploy.md carries one run's).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PG_ADMIN = os.environ.get("TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
SECRET = "bench-secret"
TOKENS = {"largest": "tok-largest-0", "middle": "tok-middle-9", "small": "tok-small-300"}
RANKS = {"largest": 0, "middle": 9, "small": 300}
N_OWNERS = 500
ACTIVE = 200
COLUMNS = (
    "id, kind, status, owner, created_at, updated_at, config, dataset, metrics, progress, "
    "error, cancel_requested, last_seq"
)


@contextmanager
def database(tag: str):
    name = f"nf_bench_{tag}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0]
    try:
        yield (
            f"{base}/{name}".replace("postgresql://", "postgresql+psycopg://", 1),
            (f"{base}/{name}"),
        )
    finally:
        from core.db.engine import dispose_all

        dispose_all()
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def owner_ids() -> list[str]:
    from service.auth import key_id

    ids = [f"h-{uuid.uuid4().hex}" for _ in range(N_OWNERS)]
    for name, rank in RANKS.items():
        ids[rank] = key_id(TOKENS[name], SECRET.encode())
    return ids


def fill(libpq_url: str, n_finished: int, seed: int = 0) -> dict[str, int]:
    """Insert n_finished finished jobs and ACTIVE unfinished ones; jobs per measured key."""
    rng = random.Random(seed)
    owners = owner_ids()
    weights = [1 / (i + 1) for i in range(N_OWNERS)]
    now = datetime.now(UTC)
    per_owner = {name: 0 for name in RANKS}
    rank_name = {rank: name for name, rank in RANKS.items()}

    def row(status: str, created: datetime, owner_rank: int):
        kind = rng.choices(("nerf", "splat", "image"), (4, 4, 2))[0]
        steps = rng.choice((3000, 10000, 30000))
        done = status == "succeeded"
        if owner_rank in rank_name:
            per_owner[rank_name[owner_rank]] += 1
        return (
            str(uuid.UUID(int=rng.getrandbits(128), version=4)),
            kind,
            status,
            owners[owner_rank],
            created,
            created + timedelta(minutes=rng.uniform(1, 90)),
            json.dumps({"steps": steps, "resolution": 512, "lr": 0.01}),
            json.dumps({"images": rng.randint(20, 400), "source": "upload.zip"}),
            json.dumps({"psnr": round(rng.uniform(18, 32), 2)} if done else {}),
            json.dumps({"step": steps if done else rng.randint(0, steps), "total_steps": steps}),
            "CUDA out of memory" if status == "failed" else None,
            status == "cancelled",
            rng.randint(3, 60),
        )

    with psycopg.connect(libpq_url) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY jobs ({COLUMNS}) FROM STDIN") as copy:
            for _ in range(n_finished):
                status = rng.choices(("succeeded", "failed", "cancelled"), (85, 10, 5))[0]
                created = now - timedelta(days=365 * rng.random(), minutes=120)
                copy.write_row(row(status, created, rng.choices(range(N_OWNERS), weights)[0]))
            for i in range(ACTIVE):
                status = "queued" if i % 2 == 0 else "running"
                created = now - timedelta(minutes=rng.uniform(30, 600))
                copy.write_row(row(status, created, rng.randrange(N_OWNERS)))
        conn.commit()
    # What autovacuum does to a table soon after a bulk load: statistics, and the visibility map
    # that lets index-only scans (the listing's count) skip the table.
    with psycopg.connect(libpq_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs")
    return per_owner


def start_api(url: str, data_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "API_KEYS_FILE")}
    env.update(
        DATA_DIR=str(data_dir),
        DATABASE_URL=url,
        KEY_ID_SECRET=SECRET,
        API_KEYS=",".join(f"{n}:{t}" for n, t in TOKENS.items()),
        LOG_FORMAT="text",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "service.app:app", "--port", str(port),
         "--log-level", "warning"],
        cwd=REPO, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(log.read_text()[-3000:])
        time.sleep(0.2)
    raise TimeoutError(log.read_text()[-3000:])


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(client: httpx.Client, path: str, params: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = client.get(path, params=params)
    ms = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    return ms, r.json()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def listing(base: str, jobs_of: dict[str, int], repeats: int) -> list[tuple[str, int, list[float]]]:
    out = []
    clients = {
        n: httpx.Client(base_url=base, headers={"Authorization": f"Bearer {t}"}, timeout=30)
        for n, t in TOKENS.items()
    }
    try:
        for c in clients.values():
            for _ in range(10):  # warm the connection, the pool and the plan cache
                timed(c, "/v1/jobs", {"limit": 50})
        for name in ("largest", "middle", "small"):
            times = [timed(clients[name], "/v1/jobs", {"limit": 50})[0] for _ in range(repeats)]
            out.append((f"first page, {name} key ({jobs_of[name]:,} jobs)", len(times), times))
        c = clients["largest"]
        times = [timed(c, "/v1/jobs", {"limit": 50, "status": "failed"})[0] for _ in range(repeats)]
        out.append(("first page, largest key, `?status=failed`", len(times), times))
        # The whole list by keyset, page after page.
        pages, cursor, seen = [], None, 0
        while True:
            params = {"limit": 50, **({"cursor": cursor} if cursor else {})}
            ms, body = timed(c, "/v1/jobs", params)
            pages.append(ms)
            seen += len(body["items"])
            cursor = body["next_cursor"]
            if not cursor:
                break
        assert seen == jobs_of["largest"], (seen, jobs_of["largest"])
        deep = pages[len(pages) // 2 :]
        out.append(
            (f"keyset pages {len(pages) // 2 + 1}-{len(pages)} of the largest key", len(deep), deep)
        )
        depth = max(0, len(pages) - 10) * 50
        times = [
            timed(c, "/v1/jobs", {"limit": 50, "offset": depth})[0] for _ in range(repeats // 4)
        ]
        out.append((f"`?offset={depth}` (for contrast), largest key", len(times), times))
    finally:
        for cl in clients.values():
            cl.close()
    return out


def _scan(plan: dict) -> str:
    """The plan's table access, e.g. `Index Only Scan using ix_x (0 heap fetches)`."""
    while "Plans" in plan and "Index Name" not in plan and "Relation Name" not in plan:
        plan = plan["Plans"][0]
    name = plan["Node Type"]
    if "Index Name" in plan:
        name += f" using {plan['Index Name']}"
    if "Heap Fetches" in plan:
        name += f" ({plan['Heap Fetches']} heap fetches)"
    return name


def db_side(libpq_url: str, owner: str, repeats: int) -> list[tuple[str, list[float]]]:
    """The listing's SQL alone (what core/store.py `list` sends for the largest key), as the
    server times it (EXPLAIN ANALYZE's execution time): a first page, a page deep in the list by
    keyset, and the `total` count."""
    visible = "status <> 'reserved' AND owner = %(owner)s"
    order = "ORDER BY created_at DESC, id DESC LIMIT 51"
    with psycopg.connect(libpq_url) as conn:
        middle = conn.execute(
            f"SELECT created_at, id FROM jobs WHERE {visible} {order.replace('51', '1')} "
            "OFFSET (SELECT count(*) / 2 FROM jobs WHERE owner = %(owner)s)",
            {"owner": owner},
        ).fetchone()
        queries = {
            "first page": f"SELECT * FROM jobs WHERE {visible} {order}",
            "keyset page halfway down": f"SELECT * FROM jobs WHERE {visible} "
            f"AND (created_at, id) < (%(at)s, %(id)s) {order}",
            "`total` (count of the key's jobs)": f"SELECT count(*) FROM jobs WHERE {visible}",
        }
        out = []
        for what, sql in queries.items():
            times = []
            for _ in range(repeats):
                plan = conn.execute(
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + sql,
                    {"owner": owner, "at": middle[0], "id": middle[1]},
                ).fetchone()[0]
                times.append(plan[0]["Execution Time"])
            out.append((f"{what}: {_scan(plan[0]['Plan'])}", times))
    return out


class Reaper:
    """Reaper rounds (worker/reaper.py `reap`, filesystem broker) on one database."""

    def __init__(self, url: str, data_dir: Path):
        from celery import Celery

        from core.celery_config import celery_config
        from core.settings import Settings
        from core.storage import LocalStorage
        from core.store import JobStore
        from worker import reaper

        logging.getLogger("worker.reaper").setLevel(logging.ERROR)  # it names every re-send
        self.reaper = reaper
        self.settings = Settings(data_dir=data_dir, database_url=url, queued_grace_s=0.0)
        self.client = Celery(f"bench-reaper-{data_dir.name}")
        self.client.conf.update(celery_config(self.settings))
        self.store = JobStore(LocalStorage(data_dir), url=url)

    def round(self) -> tuple[float, int]:
        """(ms, tasks re-sent)."""
        t0 = time.perf_counter()
        sent = self.reaper.reap(self.client, self.store, self.settings)
        return (time.perf_counter() - t0) * 1000, len(sent)


def reaper_rounds(reapers: dict[str, Reaper], steady: int) -> dict[str, tuple]:
    """Per database: (first round ms, its re-sends, steady rounds' p50 and max ms). The steady
    rounds of the databases alternate, so load on the machine falls on both alike."""
    first = {name: r.round() for name, r in reapers.items()}
    times: dict[str, list[float]] = {name: [] for name in reapers}
    for _ in range(steady):
        for name, r in reapers.items():
            ms, sent = r.round()
            assert sent == 0, f"a steady round re-sent {sent}"
            times[name].append(ms)
    return {
        name: (*first[name], statistics.median(times[name]), max(times[name])) for name in reapers
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--small", type=int, default=1_000)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    from core.db.migrate import upgrade_url

    with (
        tempfile.TemporaryDirectory(prefix="nf-jobs-bench-") as tmp,
        database("big") as (url, libpq),
        database("small") as (small_url, small_libpq),
    ):
        tmp = Path(tmp)
        upgrade_url(url)
        t0 = time.perf_counter()
        jobs_of = fill(libpq, args.jobs - ACTIVE)
        fill_s = time.perf_counter() - t0
        upgrade_url(small_url)
        fill(small_libpq, args.small)
        api, base = start_api(url, tmp / "api", tmp / "api.log")
        try:
            results = listing(base, jobs_of, args.repeats)
        finally:
            api.terminate()
            api.wait(10)
        from service.auth import key_id

        sql = db_side(libpq, key_id(TOKENS["largest"], SECRET.encode()), args.repeats)
        rounds = reaper_rounds(
            {
                f"{args.small:,} finished jobs": Reaper(small_url, tmp / "reaper-small"),
                f"{args.jobs - ACTIVE:,} finished jobs": Reaper(url, tmp / "reaper-big"),
            },
            args.rounds,
        )

    with psycopg.connect(PG_ADMIN) as conn:
        pg_version = conn.execute("SHOW server_version").fetchone()[0]
    print(
        f"\n{args.jobs:,} jobs ({args.jobs - ACTIVE:,} finished, {ACTIVE} unfinished) over "
        f"{N_OWNERS} keys, inserted in {fill_s:.1f} s; PostgreSQL {pg_version}; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end\n"
    )
    print("| `GET /v1/jobs?limit=50` | requests | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    for what, n, times in results:
        print(f"| {what} | {n} | {pct(times, 50):.1f} | {pct(times, 99):.1f} |")
    print()
    print("| the listing's SQL, largest key (server execution time) | runs | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    for what, times in sql:
        print(f"| {what} | {len(times)} | {pct(times, 50):.2f} | {pct(times, 99):.2f} |")
    print()
    print(
        f"| reaper round, {ACTIVE} unfinished jobs | first round ms (tasks re-sent) "
        f"| next {args.rounds} rounds p50 ms | max ms |"
    )
    print("|---|---:|---:|---:|")
    for label, (first, sent, p50, worst) in rounds.items():
        print(f"| {label} | {first:.0f} ({sent}) | {p50:.1f} | {worst:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
