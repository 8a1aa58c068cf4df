"""Alembic's environment: migrate the connection core.db.migrate hands over (online only)."""

from __future__ import annotations

from alembic import context

import core.db.jobs  # noqa: F401  (registers the tables on Base.metadata)
from core.db.base import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through core.db.migrate (python -m core.db upgrade)")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # ALTER TABLE on SQLite needs batches
    transaction_per_migration=True,
)
with context.begin_transaction():
    context.run_migrations()
