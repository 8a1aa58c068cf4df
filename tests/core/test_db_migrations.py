"""The migrations build exactly the schema the table classes declare (core/db/*.py), on SQLite and
PostgreSQL: a table, column, index or foreign key added to a class without a revision (or a
revision edited after the fact) shows up here as a difference."""

from __future__ import annotations

import importlib
import pkgutil

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

import core.db
from core.db.base import Base


def _all_tables() -> None:
    for mod in pkgutil.iter_modules(core.db.__path__):
        if not mod.ispkg and not mod.name.startswith("_"):
            importlib.import_module(f"core.db.{mod.name}")


def test_migrated_schema_matches_the_table_classes(db_url):
    _all_tables()
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()
    # alembic's own bookkeeping table is not one of ours
    diff = [d for d in diff if not (d[0] == "remove_table" and d[1].name == "alembic_version")]
    assert diff == [], "\n".join(map(str, diff))
