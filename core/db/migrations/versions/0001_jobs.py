"""jobs and job_events

Revision ID: 0001_jobs
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from core.db.base import Json, UtcDateTime

revision = "0001_jobs"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(64), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
        sa.Column("config", Json, nullable=False),
        sa.Column("dataset", Json, nullable=False),
        sa.Column("metrics", Json, nullable=False),
        sa.Column("progress", Json, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
    )
    op.create_index("ix_jobs_owner_created", "jobs", ["owner", "created_at", "id"])
    op.create_index("ix_jobs_owner_status_created", "jobs", ["owner", "status", "created_at", "id"])
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_table(
        "job_events",
        sa.Column(
            "job_id",
            sa.String(36),
            sa.ForeignKey("jobs.id", ondelete="CASCADE", name="fk_job_events_job_id_jobs"),
            primary_key=True,
        ),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("data", Json, nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("job_events")
    op.drop_table("jobs")
