"""`nf db upgrade` / `python -m core.db upgrade` as an operator runs them (subprocesses): the
SQLite default under DATA_DIR and a PostgreSQL DATABASE_URL, migrated to head, twice."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from core.db.migrate import alembic_config
from tests.support.databases import postgres_database
from tests.support.stack import REPO


def _run(module: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DATA_DIR")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _check(url: str) -> None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
    finally:
        engine.dispose()
    assert {"jobs", "job_events", "alembic_version"} <= tables


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_db_upgrade_migrates_to_head_and_again(kind, tmp_path):
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()

    def both(env: dict[str, str], url: str) -> None:
        for module, args in (("service.cli", ("db", "upgrade")), ("core.db", ("upgrade",))):
            r = _run(module, env, *args)
            assert r.returncode == 0, r.stderr
            assert r.stdout.strip().endswith(f"at {head}"), r.stdout
        assert _run("core.db", env, "current").stdout.strip() == head
        _check(url)

    if kind == "sqlite":
        both({"DATA_DIR": str(tmp_path)}, f"sqlite:///{tmp_path / 'service.db'}")
        return
    with postgres_database() as url:
        r = _run("core.db", {"DATABASE_URL": url, "DATA_DIR": str(tmp_path)}, "current")
        assert r.stdout.strip() == "(empty)"
        both({"DATABASE_URL": url, "DATA_DIR": str(tmp_path)}, url)
