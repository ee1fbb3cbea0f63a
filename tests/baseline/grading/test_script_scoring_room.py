"""A script grading that waits for room for its scoring workspace asks again read only."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from baseline.context import Context
from baseline.errors import InvalidInput
from baseline.grading import reproductions, script_scoring
from baseline.models import (
    Attempt,
    Grading,
    GradingKind,
    Host,
    JobStatus,
    Workspace,
    WorkspacePurpose,
)
from baseline.workspaces import gpu_allocation
from infra.workspace import WorkspaceBackend
from tests.baseline.attempt_world import blobless_final_snapshot, make_attempt
from tests.baseline.workspaces.gpu_holder import full_gpu_host
from tests.db_writes import recording_writes

WAITING = str(reproductions.NoRoom.for_purpose(WorkspacePurpose.SCORING))


def _waiting_grading(ctx: Context, error: str | None) -> tuple[int, Host]:
    """A queued script grading of an A10 attempt's final snapshot, on a host whose one A10 a
    participant's workspace holds."""
    attempt_id = make_attempt(ctx)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.hardware_profile = "a10"
        attempt.image_digest = "sha256:" + "a" * 64
        host = full_gpu_host(session)
        snapshot = blobless_final_snapshot(session, attempt_id)
        grading = Grading(snapshot_id=snapshot.id, kind=GradingKind.SCRIPT, config={}, error=error)
        session.add(grading)
        session.flush()
        return grading.id, host


def _no_engine(_host: Host) -> WorkspaceBackend:
    raise AssertionError("no engine is needed to find that there is still no room")


@pytest.mark.sqlite_only("statements recorded; the allocator's queries run on both elsewhere")
def test_a_grading_still_waiting_for_room_writes_nothing(ctx: Context) -> None:
    """Each try of a script grading waiting for GPUs, one a pass for as long as they stayed
    taken, claimed it, started its heartbeat, found no room and queued it again: two writes for
    every waiting grading on every pass. One that says it waits now asks first, read only."""
    grading_id, _ = _waiting_grading(ctx, WAITING)
    with recording_writes(ctx.engine) as written:
        left = script_scoring.run_script_grading(ctx, grading_id, backend_factory=_no_engine)
    assert written == []
    assert left.status is JobStatus.QUEUED and left.error == WAITING and left.tries == 0
    with ctx.session() as session:
        row = session.get(Grading, grading_id)
        assert row is not None and row.started_at is None and "workspace" not in row.config


def test_a_waiting_grading_goes_on_once_a_gpu_is_free(ctx: Context) -> None:
    """The read-only question holds back only while there is no room: with the GPU free, the
    grading goes on to its scoring (here its task has no scoring script, which it says)."""
    grading_id, host = _waiting_grading(ctx, WAITING)
    with ctx.session() as session:
        for workspace in session.scalars(select(Workspace).where(Workspace.host_id == host.id)):
            gpu_allocation.release(session, workspace)
    with pytest.raises(InvalidInput, match="is not a scored task: it has no scoring script"):
        script_scoring.run_script_grading(ctx, grading_id, backend_factory=_no_engine)
