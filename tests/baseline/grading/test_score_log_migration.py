"""Migration 0008 (an intermediate score recorded while it runs) on a database that already
holds intermediate scores."""

from __future__ import annotations

from alembic import command
from sqlalchemy import inspect, text

from baseline import migrate
from baseline.context import Context
from baseline.grading import grading_recovery, script_scoring
from baseline.models import JobStatus, utcnow
from tests.scoring.scoring_world import build_world


def test_the_migration_keeps_the_scores_and_marks_them_ended(ctx: Context) -> None:
    """A database at 0007 holding a score, a score at the floor and a scoring that could not
    run: upgraded, each is kept as it was, ended (succeeded with a score, failed without), and
    recovery takes none for an interrupted one."""
    attempt_id = build_world(ctx).attempt_id
    ctx.engine.dispose()
    config = migrate.alembic_config(ctx.settings.database_url)
    command.downgrade(config, "0007")
    columns = {c["name"] for c in inspect(ctx.engine).get_columns("score_logs")}
    assert not {"status", "heartbeat_at", "workspace"} & columns
    rows = [
        (60.0, 0.8, 0.5, None, None),
        (120.0, 0.2, 0.0, "no_score", "no_score: solution.py failed"),
        (180.0, None, None, None, "scoring could not run: the engine stopped answering"),
    ]
    with ctx.engine.begin() as conn:
        for working_s, raw, normalised, floor, error in rows:
            conn.execute(
                text(
                    "INSERT INTO score_logs (attempt_id, working_s, raw_score, normalised_score, "
                    "floor_reason, error, created_at) VALUES (:a, :w, :r, :n, :f, :e, :c)"
                ),
                {"a": attempt_id, "w": working_s, "r": raw, "n": normalised, "f": floor,
                 "e": error, "c": utcnow().isoformat()},
            )  # fmt: skip
    ctx.engine.dispose()
    command.upgrade(config, "head")

    with ctx.session() as session:
        logs = script_scoring.score_logs(session, attempt_id)
        assert [
            (r.working_s, r.raw_score, r.normalised_score, r.floor_reason, r.error) for r in logs
        ] == rows
        assert [(r.status, r.heartbeat_at, r.workspace) for r in logs] == [
            (JobStatus.SUCCEEDED, None, None),
            (JobStatus.SUCCEEDED, None, None),
            (JobStatus.FAILED, None, None),
        ]
    assert grading_recovery.recover_intermediate_scores(ctx) == []
