"""Databases for tests: a fresh PostgreSQL database (created and dropped per use, on the server
at 127.0.0.1:5432 with trust auth) or an SQLite file, migrated to head.

    settings = Settings(data_dir=tmp, database_url=url)  # url from `database(kind, tmp)`
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

PG_ADMIN = os.environ.get("TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
KINDS = ("sqlite", "postgresql")


@contextmanager
def postgres_database() -> Iterator[str]:
    """A new, empty PostgreSQL database; yields its SQLAlchemy URL; dropped afterwards."""
    name = f"nf_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        from core.db.engine import dispose_all

        dispose_all()
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def database(kind: str, tmp: Path) -> Iterator[str]:
    """A migrated database of `kind` ("sqlite": a file under `tmp`; "postgresql"); its URL."""
    from core.db.migrate import upgrade_url

    if kind == "sqlite":
        url = f"sqlite:///{Path(tmp).resolve() / 'service.db'}"
        upgrade_url(url)
        yield url
        return
    with postgres_database() as url:
        upgrade_url(url)
        yield url
