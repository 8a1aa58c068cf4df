"""One SQLAlchemy engine per database URL and process, and sessions on it.

SQLite (the embedded default, `<DATA_DIR>/service.db`) runs in WAL mode so readers never wait
for the writer, with a busy timeout so concurrent writers queue instead of failing, and foreign
keys on. Its transactions are started by us (`BEGIN`, or `BEGIN IMMEDIATE` for a session opened
with `write=True`): a read-modify-write must hold the write lock from its first read, which is
SQLite's equivalent of PostgreSQL's `SELECT ... FOR UPDATE`.

Every PostgreSQL call is bounded: a connect times out after `PG_CONNECT_TIMEOUT_S`, a statement
(a lock wait included) after `PG_STATEMENT_TIMEOUT_MS`, a connection whose sent data goes
unacknowledged for `PG_TCP_USER_TIMEOUT_MS` (a partitioned host) is dropped by the kernel, an idle
one is probed by TCP keepalives, and the server ends a session left idle inside a transaction (its
row locks with it) after `PG_IDLE_IN_TRANSACTION_MS`. Parameters of the same names in
DATABASE_URL's query (libpq's `connect_timeout`, `tcp_user_timeout`, `keepalives*`, `options`)
win. SQLite waits at most `SQLITE_BUSY_TIMEOUT_MS` for a lock.

`db_now` is the database's clock, which every lease and reservation expiry is written and judged
with: hosts' clocks may disagree, the database's is one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 10
PG_STATEMENT_TIMEOUT_MS = 30_000
PG_TCP_USER_TIMEOUT_MS = 20_000
PG_IDLE_IN_TRANSACTION_MS = 60_000
PG_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
WRITE_LOCK = "nf_sqlite_write_lock"

_engines: dict[tuple[str, int], Engine] = {}
_lock = threading.Lock()


def database_url(settings) -> str:
    """DATABASE_URL, else the SQLite file under DATA_DIR."""
    if getattr(settings, "database_url", None):
        return settings.database_url
    return f"sqlite:///{Path(settings.data_dir).resolve() / 'service.db'}"


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # pysqlite's own transaction handling would BEGIN lazily (and never for SELECT); we
        # issue BEGIN ourselves in `_on_begin`.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")
        # FULL: a commit is on disk before it returns (NORMAL could lose the last commits to a
        # power cut, e.g. a job whose 202 the client already has).
        cur.execute("PRAGMA synchronous = FULL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        immediate = conn.get_execution_options().get(WRITE_LOCK)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def pg_connect_args(url: str) -> dict:
    """libpq parameters bounding every call (see the module's docstring); the URL's own win."""
    query = make_url(url).query
    args: dict = {}
    if "connect_timeout" not in query:
        args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    if "tcp_user_timeout" not in query:
        args["tcp_user_timeout"] = PG_TCP_USER_TIMEOUT_MS
    for name, value in PG_KEEPALIVES.items():
        if name not in query:
            args[name] = value
    options = (
        f"-c statement_timeout={PG_STATEMENT_TIMEOUT_MS} "
        f"-c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_MS}"
    )
    given = query.get("options")
    if given:  # later -c settings win: the URL's own come last
        options += " " + (given if isinstance(given, str) else " ".join(given))
    args["options"] = options
    return args


def db_now(s: Session) -> datetime:
    """The database's time (PostgreSQL's `now()`: its transaction's start, so never later than
    the moment the statement runs). SQLite's database is a file of this host, whose clock every
    process using it shares."""
    if s.get_bind().dialect.name == "postgresql":
        return s.scalar(text("SELECT now()")).astimezone(UTC)
    return datetime.now(UTC)


def engine_for_url(url: str) -> Engine:
    """The process's engine for `url` (made on first use). Keyed by pid as well: a forked
    Celery child must not share its parent's pooled connections."""
    key = (url, os.getpid())
    with _lock:
        engine = _engines.get(key)
        if engine is not None:
            return engine
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            if parsed.database and parsed.database != ":memory:":
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
            _sqlite_setup(engine)
        else:
            engine = create_engine(
                url,
                pool_pre_ping=True,
                pool_size=5,
                max_overflow=10,
                pool_timeout=PG_CONNECT_TIMEOUT_S * 3,
                connect_args=pg_connect_args(url),
            )
        _engines[key] = engine
        return engine


def engine_for(settings=None) -> Engine:
    """The engine for `settings.database_url` (default: the process's settings)."""
    if settings is None:
        from core.settings import get_settings

        settings = get_settings()
    return engine_for_url(database_url(settings))


def dispose_all() -> None:
    """Close every pooled connection of this process (tests dropping a database)."""
    with _lock:
        for (_, pid), engine in list(_engines.items()):
            if pid == os.getpid():
                engine.dispose()
        _engines.clear()


@contextmanager
def session(
    settings=None, *, write: bool = False, engine: Engine | None = None
) -> Iterator[Session]:
    """A session inside one transaction, committed on leaving (rolled back on an exception).
    `write=True` takes SQLite's write lock at BEGIN, for read-modify-write transactions (on
    PostgreSQL, lock the rows read with `with_for_update()`)."""
    engine = engine or engine_for(settings)
    with Session(engine, expire_on_commit=False) as s, s.begin():
        if write and engine.dialect.name == "sqlite":
            s.connection(execution_options={WRITE_LOCK: True})
        yield s


def insert_if_missing(s: Session, table, **values) -> None:
    """Insert a row unless one with its key exists, without failing when another transaction
    inserts it at the same moment (ON CONFLICT DO NOTHING, in either dialect)."""
    ins = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    s.execute(ins(table).values(**values).on_conflict_do_nothing())


def _forget_after_fork() -> None:
    # The parent's connections belong to the parent; the child opens its own.
    global _lock
    _lock = threading.Lock()
    for engine in list(_engines.values()):
        engine.dispose(close=False)
    _engines.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
