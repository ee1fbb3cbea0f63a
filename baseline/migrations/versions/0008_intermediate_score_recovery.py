"""an intermediate score recorded while it runs

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 23:40:00

Adds ``status``, ``heartbeat_at`` and ``workspace`` to score_logs: an intermediate score is now
written when it is asked, running while it is scored, with its runner's sign of life and the
name of its scoring workspace, so that one whose process died (its attempt's clock left paused
with reason scoring, its scoring workspace holding its GPUs) is recovered. Rows stored before
were written when their scoring ended: succeeded when they hold a score (the floor included),
failed otherwise.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import baseline.models

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

JOB_STATUS = sa.Enum(
    "queued",
    "running",
    "succeeded",
    "incomplete",
    "failed",
    name="jobstatus",
    native_enum=False,
    length=32,
)


def upgrade() -> None:
    with op.batch_alter_table("score_logs") as batch:
        batch.add_column(sa.Column("status", JOB_STATUS, nullable=True))
        batch.add_column(
            sa.Column("heartbeat_at", baseline.models.UTCDateTime(timezone=True), nullable=True)
        )
        batch.add_column(sa.Column("workspace", sa.String(length=200), nullable=True))
    op.execute(
        "UPDATE score_logs SET status = CASE WHEN normalised_score IS NULL "
        "THEN 'failed' ELSE 'succeeded' END"
    )


def downgrade() -> None:
    with op.batch_alter_table("score_logs") as batch:
        batch.drop_column("workspace")
        batch.drop_column("heartbeat_at")
        batch.drop_column("status")
