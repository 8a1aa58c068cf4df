"""leases, exports, renders, quota state

Revision ID: 0002_state
Revises: 0001_jobs
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from core.db.base import Json, UtcDateTime

revision = "0002_state"
down_revision = "0001_jobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("subject", sa.String(80), primary_key=True),
        sa.Column("job_id", sa.String(36), nullable=True),
        sa.Column("holder", sa.String(255), nullable=True),
        sa.Column("expires_at", UtcDateTime(), nullable=True),
        sa.Column("deliveries", sa.Integer(), nullable=False),
        sa.Column("losses", sa.Integer(), nullable=False),
        sa.Column("open", sa.Boolean(), nullable=False),
        sa.Column("resent_at", UtcDateTime(), nullable=True),
    )
    op.create_index("ix_leases_job_id", "leases", ["job_id"])
    op.create_index("ix_leases_kind_expires_at", "leases", ["kind", "expires_at"])
    op.create_table(
        "exports",
        sa.Column("job_id", sa.String(36), primary_key=True),
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("options", Json, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("artifact", sa.String(255), nullable=True),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("stats", Json, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
    )
    op.create_index("ix_exports_status_updated_at", "exports", ["status", "updated_at"])
    op.create_table(
        "renders",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("n_frames", sa.Integer(), nullable=False),
        sa.Column("frames_done", sa.Integer(), nullable=False),
        sa.Column("n_pixels", sa.BigInteger(), nullable=True),
        sa.Column("pixels_done", sa.BigInteger(), nullable=True),
        sa.Column("checkpoint_step", sa.Integer(), nullable=True),
        sa.Column("artifact", sa.String(255), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("request", Json, nullable=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
    )
    op.create_index("ix_renders_job_id", "renders", ["job_id"])
    op.create_index("ix_renders_status_updated_at", "renders", ["status", "updated_at"])
    op.create_table(
        "quota_owners",
        sa.Column("owner", sa.String(64), primary_key=True),
        sa.Column("admissions", sa.Integer(), nullable=False),
    )
    op.create_table(
        "quota_submissions",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("at", UtcDateTime(), nullable=False),
    )
    op.create_index("ix_quota_submissions_owner_at", "quota_submissions", ["owner", "at"])
    op.create_table(
        "job_storage",
        sa.Column("job_id", sa.String(36), primary_key=True),
        sa.Column("stored_bytes", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), nullable=False),
    )


def downgrade() -> None:
    for table in ("job_storage", "quota_submissions", "quota_owners", "renders", "exports"):
        op.drop_table(table)
    op.drop_table("leases")
