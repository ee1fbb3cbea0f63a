"""a running grading's claim and heartbeat

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05 19:00:00

Adds ``started_at`` and ``heartbeat_at`` to gradings: a runner claims a queued grading by setting
it running with its ``started_at`` in one conditional update (a second runner is refused), and
beats ``heartbeat_at`` while it runs, so that one whose process was killed is recognised and
recovered (its scoring workspace destroyed, the grading queued again as a failed try of
Baseline's own).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import baseline.models

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gradings") as batch:
        batch.add_column(
            sa.Column("started_at", baseline.models.UTCDateTime(timezone=True), nullable=True)
        )
        batch.add_column(
            sa.Column("heartbeat_at", baseline.models.UTCDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("gradings") as batch:
        batch.drop_column("heartbeat_at")
        batch.drop_column("started_at")
