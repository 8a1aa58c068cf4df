"""A prefork pool in small for delivery tests: one Python imports the worker modules once and
runs each delivery (a line on its stdin) in a process forked from itself, as Celery's pool
processes are, answering one line per delivery. A fresh Python per delivery pays the imports
(torch) again: seconds each."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path


def start_pool(script: str, settings, log: Path, without: tuple[str, ...] = ()) -> subprocess.Popen:
    """The pool running `script` against `settings`' data dir and database (MAX_WORKER_LOSSES
    3, the settings' lease TTL; this environment less the names in `without`), its stderr in
    `log`."""
    proc_env = {
        **{k: v for k, v in os.environ.items() if k not in without},
        "DATA_DIR": str(settings.data_dir),
        "DATABASE_URL": settings.database_url,
        "MAX_WORKER_LOSSES": "3",
        "LEASE_TTL_S": str(settings.lease_ttl_s),
    }
    with open(log, "w") as err:
        return subprocess.Popen(
            [sys.executable, "-c", script],
            env=proc_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )


def deliver(pool: subprocess.Popen, log: Path, line: str) -> str:
    """Sends one delivery; the pool's answer line (stripped)."""
    pool.stdin.write(line + "\n")
    pool.stdin.flush()
    ready, _, _ = select.select([pool.stdout], [], [], 120)
    answer = pool.stdout.readline() if ready else ""
    assert answer, f"no answer from the pool for {line!r}:\n{log.read_text()[-2000:]}"
    return answer.strip()
