"""webhook keys, job callback URLs, delivery log

Revision ID: 0003_webhooks
Revises: 0002_state
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from core.db.base import Json, UtcDateTime

revision = "0003_webhooks"
down_revision = "0002_state"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_keys",
        sa.Column("owner", sa.String(64), primary_key=True),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("secret", sa.String(128), nullable=True),
    )
    op.create_table(
        "webhook_jobs",
        sa.Column("job_id", sa.String(36), primary_key=True),
        sa.Column("url", sa.Text(), nullable=False),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("job_id", sa.String(36), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("event", Json, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", Json, nullable=False),
        sa.Column("next_attempt_at", UtcDateTime(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
    )
    op.create_index(
        "ix_webhook_deliveries_status_next", "webhook_deliveries", ["status", "next_attempt_at"]
    )


def downgrade() -> None:
    for table in ("webhook_deliveries", "webhook_jobs", "webhook_keys"):
        op.drop_table(table)
