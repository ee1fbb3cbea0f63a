"""The portal's view of a running reproduction's log: the live file of the claim that runs now."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from baseline.context import Context
from baseline.grading import reproductions
from baseline.models import JobStatus, Reproduction, Role, Snapshot, utcnow
from baseline.people import accounts
from tests.conftest import Users, json_of
from tests.scoring.scoring_world import build_world, snapshot_reference


@pytest.mark.sqlite_only
def test_the_api_shows_the_live_log_of_the_claim_that_runs_now(
    client: FlaskClient, ctx: Context, users: Users, tmp_path: Path
) -> None:
    """A taken-over runner's file may still be there beside the running claim's: the portal
    shows the running one's, and none once the row no longer runs."""
    world = build_world(ctx, image_digest="sha256:" + "a" * 64)
    snapshot_id = snapshot_reference(ctx, world.attempt_id, tmp_path / "ref")
    claim = utcnow()
    with ctx.session() as session:
        snapshot = session.get(Snapshot, snapshot_id)
        assert snapshot is not None
        row = reproductions.queue_reproduction(session, snapshot)
        row.status, row.started_at = JobStatus.RUNNING, claim
        reproduction_id = row.id
        token = accounts.issue_token(session, session.merge(users[Role.COORDINATOR]), "live")
    older = reproductions.live_log_path(ctx.settings, reproduction_id, claim - timedelta(hours=1))
    older.parent.mkdir(parents=True, exist_ok=True)
    older.write_bytes(b"the taken-over runner's\n")
    headers = {"Authorization": f"Bearer {token}"}

    def log() -> tuple[int, bytes]:
        answer = client.get(f"/api/v1/reproductions/{reproduction_id}/log", headers=headers)
        return answer.status_code, answer.data

    def has_log() -> bool:
        answer = client.get(f"/api/v1/reproductions/{reproduction_id}", headers=headers)
        assert answer.status_code == 200, answer.data
        return bool(json_of(answer)["has_log"])

    assert log()[0] == 404 and not has_log()  # this claim's runner has written nothing yet
    reproductions.live_log_path(ctx.settings, reproduction_id, claim).write_bytes(b"running\n")
    assert log() == (200, b"running\n") and has_log()
    with ctx.session() as session:
        running = session.get(Reproduction, reproduction_id)
        assert running is not None
        running.status = JobStatus.QUEUED  # e.g. taken over by recovery: no run goes on
    assert log()[0] == 404 and not has_log()
