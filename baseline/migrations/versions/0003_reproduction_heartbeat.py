"""a running reproduction's heartbeat

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05 03:15:00

Adds ``heartbeat_at`` to reproductions: the runner's latest sign of life while a reproduction
runs, so that one whose process was killed is recognised and recovered (its workspace destroyed,
the reproduction queued again as a failed try of Baseline's own).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import baseline.models

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reproductions") as batch:
        batch.add_column(
            sa.Column("heartbeat_at", baseline.models.UTCDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("reproductions") as batch:
        batch.drop_column("heartbeat_at")
