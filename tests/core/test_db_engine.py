"""core.db.engine's SQLite connections: WAL (readers never wait for the writer) with every commit
on disk before it returns (synchronous FULL: a job whose 202 was answered survives a power cut)."""

from __future__ import annotations

from sqlalchemy import text

from core.db.engine import engine_for_url


def test_sqlite_commits_are_durable(tmp_path):
    engine = engine_for_url(f"sqlite:///{tmp_path / 'service.db'}")
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 2  # FULL
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
