"""a participant's failed scoring is a result at the task's floor

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-04 21:40:00

Adds ``floor_reason`` to gradings and score logs, and applies the rule of
`scoring.scoring_run.floor_reason` to rows stored before it: a script grading or intermediate
score that failed because of the submission (its error starts with process_failed, timed_out,
unparseable_output or no_score) becomes the task's floor (normalised 0, raw = the task's
starting score) with that reason; a Task Standard family's ``no_score`` (manual scoring) and a
scoring that could not run stay as they were. The error text is kept: it says why.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

FLOOR_FAILURES = ("process_failed", "timed_out", "unparseable_output", "no_score")


def _floor(error: str | None, scoring: Any) -> tuple[str, float | None] | None:
    """(reason, raw starting score) when a stored failure stands at the floor, else None."""
    reason = (error or "").split(":", 1)[0]
    if reason not in FLOOR_FAILURES:
        return None
    if isinstance(scoring, str):
        scoring = json.loads(scoring)
    scoring = scoring or {}
    if reason == "no_score" and scoring.get("task_standard"):
        return None
    start = scoring.get("starting_score")
    return reason, float(start) if isinstance(start, int | float) else None


def upgrade() -> None:
    with op.batch_alter_table("gradings") as batch:
        batch.add_column(sa.Column("floor_reason", sa.String(length=40), nullable=True))
    with op.batch_alter_table("score_logs") as batch:
        batch.add_column(sa.Column("floor_reason", sa.String(length=40), nullable=True))
    conn = op.get_bind()
    failed_gradings = conn.execute(
        sa.text(
            "SELECT g.id, g.error, t.scoring FROM gradings g "
            "JOIN snapshots s ON s.id = g.snapshot_id "
            "JOIN attempts a ON a.id = s.attempt_id "
            "JOIN tasks t ON t.id = a.task_id "
            "WHERE g.kind = 'script' AND g.status = 'failed'"
        )
    ).all()
    for grading_id, error, scoring in failed_gradings:
        floor = _floor(error, scoring)
        if floor is not None:
            conn.execute(
                sa.text(
                    "UPDATE gradings SET status = 'succeeded', score = 0.0, raw_score = :raw, "
                    "floor_reason = :reason WHERE id = :id"
                ),
                {"raw": floor[1], "reason": floor[0], "id": grading_id},
            )
    failed_logs = conn.execute(
        sa.text(
            "SELECT l.id, l.error, t.scoring FROM score_logs l "
            "JOIN attempts a ON a.id = l.attempt_id "
            "JOIN tasks t ON t.id = a.task_id "
            "WHERE l.error IS NOT NULL AND l.normalised_score IS NULL"
        )
    ).all()
    for log_id, error, scoring in failed_logs:
        floor = _floor(error, scoring)
        if floor is not None:
            conn.execute(
                sa.text(
                    "UPDATE score_logs SET normalised_score = 0.0, raw_score = :raw, "
                    "floor_reason = :reason WHERE id = :id"
                ),
                {"raw": floor[1], "reason": floor[0], "id": log_id},
            )


def downgrade() -> None:
    conn = op.get_bind()
    conn.execute(
        sa.text(
            "UPDATE gradings SET status = 'failed', score = NULL, raw_score = NULL "
            "WHERE floor_reason IS NOT NULL"
        )
    )
    conn.execute(
        sa.text(
            "UPDATE score_logs SET normalised_score = NULL, raw_score = NULL "
            "WHERE floor_reason IS NOT NULL"
        )
    )
    with op.batch_alter_table("score_logs") as batch:
        batch.drop_column("floor_reason")
    with op.batch_alter_table("gradings") as batch:
        batch.drop_column("floor_reason")
