"""Migration 0006 (a grading's claim and heartbeat) on a database that already holds gradings."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from sqlalchemy import inspect

from baseline import migrate
from baseline.context import Context
from baseline.grading import claims, script_scoring
from baseline.models import Grading, JobStatus, Snapshot
from tests.scoring.scoring_world import build_world, snapshot_reference


def test_the_claim_migration_keeps_gradings_and_lets_them_be_claimed(
    ctx: Context, tmp_path: Path
) -> None:
    """A database at 0005 holding a queued and a succeeded grading: upgraded, both are kept as
    they were, with no claim, and the queued one can be claimed."""
    world = build_world(ctx)
    snapshot_id = snapshot_reference(ctx, world.attempt_id, tmp_path / "ref")
    with ctx.session() as session:
        snapshot = session.get(Snapshot, snapshot_id)
        assert snapshot is not None
        queued = script_scoring.create_script_grading(session, snapshot)
        done = script_scoring.create_script_grading(session, snapshot)
        done.status, done.score = JobStatus.SUCCEEDED, 0.25
        ids = (queued.id, done.id)
    ctx.engine.dispose()
    config = migrate.alembic_config(ctx.settings.database_url)
    command.downgrade(config, "0005")
    columns = {c["name"] for c in inspect(ctx.engine).get_columns("gradings")}
    assert "started_at" not in columns and "heartbeat_at" not in columns
    ctx.engine.dispose()
    command.upgrade(config, "head")

    with ctx.session() as session:
        rows = [session.get(Grading, i) for i in ids]
        assert [(r.status, r.score, r.started_at, r.heartbeat_at) for r in rows if r] == [
            (JobStatus.QUEUED, None, None, None),
            (JobStatus.SUCCEEDED, 0.25, None, None),
        ]
    claim = claims.claim(ctx, Grading, ids[0])
    with ctx.session() as session:
        claimed = session.get(Grading, ids[0])
        assert claimed is not None
        assert (claimed.status, claimed.started_at, claimed.heartbeat_at) == (
            JobStatus.RUNNING,
            claim,
            claim,
        )
