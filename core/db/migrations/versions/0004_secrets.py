"""secrets the deployment makes once (the key-id secret)

Revision ID: 0004_secrets
Revises: 0003_webhooks
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_secrets"
down_revision = "0003_webhooks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("secrets")
