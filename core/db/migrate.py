"""Apply the Alembic migrations (core/db/migrations/) programmatically.

Called at start-up by the API and the workers, and by `nf db upgrade` / `python -m core.db
upgrade`. Several processes may start at once: on PostgreSQL the upgrade runs under a
session-level advisory lock, so one migrates while the others wait and then find nothing to do;
on SQLite the upgrade holds the database's write lock from its BEGIN, so the others wait.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError

from core.db.engine import WRITE_LOCK, database_url, engine_for_url

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# Any fixed 64-bit number, the same in every process of the deployment.
ADVISORY_LOCK_ID = 0x6E665F6D69677261  # "nf_migra"


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's config pointing at the packaged migrations (no alembic.ini: this works from an
    installed wheel as well as from the repository)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def upgrade_url(url: str, revision: str = "head") -> None:
    """Upgrade the database at `url` to `revision`."""
    engine = engine_for_url(url)
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            # A migration (or the wait for another process's) may outlast the statement time
            # limit every other call has (core/db/engine.py).
            conn.execute(text("SET statement_timeout = 0"))
            conn.execute(text("SELECT pg_advisory_lock(:id)"), {"id": ADVISORY_LOCK_ID})
            conn.commit()
            try:
                command.upgrade(alembic_config(conn), revision)
                conn.commit()
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": ADVISORY_LOCK_ID})
                conn.execute(text("RESET statement_timeout"))
                conn.commit()
        return
    for attempt in range(5):
        try:
            # BEGIN IMMEDIATE: the write lock from the start, so a second process waits for the
            # first one's migration (busy timeout) and then finds nothing to do.
            with engine.connect() as conn:
                conn.execution_options(**{WRITE_LOCK: True})
                with conn.begin():
                    command.upgrade(alembic_config(conn), revision)
            return
        except OperationalError as exc:
            # Still possible: "database is locked" past the busy timeout; on retry the work is
            # usually done.
            if attempt == 4:
                raise
            log.info("migration raced another process (%s); retrying", exc.orig)
            time.sleep(0.2 * (attempt + 1))


_done: set[str] = set()
_done_lock = threading.Lock()


def ensure(url: str) -> None:
    """`upgrade_url(url)` once per process (every JobStore calls it; the first one migrates)."""
    with _done_lock:
        if url in _done:
            return
        upgrade_url(url)
        _done.add(url)


def upgrade(settings=None, revision: str = "head") -> None:
    """Upgrade the deployment's database (settings.database_url, else SQLite under DATA_DIR)."""
    if settings is None:
        from core.settings import get_settings

        settings = get_settings()
    upgrade_url(database_url(settings), revision)


def current(settings=None) -> str | None:
    """The revision the database is at (None: never migrated)."""
    from alembic.runtime.migration import MigrationContext

    if settings is None:
        from core.settings import get_settings

        settings = get_settings()
    with engine_for_url(database_url(settings)).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
