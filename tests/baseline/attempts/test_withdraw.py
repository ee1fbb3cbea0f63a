"""Withdrawing an attempt assigned by mistake: only one that never started, with its workspace
request if it waits for a host; its row goes and the audit trail says who, why and whose."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from baseline.attempts import attempts
from baseline.context import Context
from baseline.errors import Conflict, InvalidInput, NotFound
from baseline.models import (
    Attempt,
    AttemptStatus,
    AuditEvent,
    Host,
    StudyStatus,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.workspaces import workspaces
from tests.baseline.attempt_world import directory_resolver, make_attempt
from tests.baseline.fake_engine import FakeEngine
from tests.scoring.scoring_world import set_study_status


def _waiting_for_a_host(ctx: Context, attempt_id: int, status: WorkspaceStatus) -> str:
    """The attempt launched onto full hosts: its workspace row waits (or is being placed)."""
    name = f"ws-a{attempt_id}-waiting"
    with ctx.session() as session:
        session.add(Host(name="engine", docker_url="unix:///run/engine.sock", healthy=True))
        session.add(
            Workspace(
                purpose=WorkspacePurpose.ATTEMPT, backend="fake", name=name, image="img",
                hardware_profile="cpu", network="none", status=status, attempt_id=attempt_id,
            )
        )  # fmt: skip
    return name


def _withdrawals(ctx: Context) -> list[AuditEvent]:
    with ctx.session() as session:
        query = select(AuditEvent).where(AuditEvent.action == "attempt.withdraw")
        return list(session.scalars(query))


def test_an_attempt_never_launched_is_withdrawn_and_its_record_kept(ctx: Context) -> None:
    attempt_id = make_attempt(ctx, human=True)
    with pytest.raises(InvalidInput, match="needs a reason"):
        attempts.withdraw(ctx, attempt_id, None, "  ")
    attempts.withdraw(ctx, attempt_id, None, "assigned the wrong task")
    with ctx.session() as session:
        assert session.get(Attempt, attempt_id) is None
    [event] = _withdrawals(ctx)
    assert (
        event.target_id == str(attempt_id) and event.details["reason"] == "assigned the wrong task"
    )
    assert event.details["task"].startswith("task-") and event.details["participant"]
    with pytest.raises(NotFound):
        attempts.withdraw(ctx, attempt_id, None, "again")


def test_a_launch_waiting_for_a_host_is_withdrawn_with_its_request(ctx: Context) -> None:
    attempt_id = make_attempt(ctx)
    name = _waiting_for_a_host(ctx, attempt_id, WorkspaceStatus.PENDING)
    attempts.withdraw(ctx, attempt_id, None, "one run too many")
    engine = FakeEngine(name="fake")
    with ctx.session() as session:
        assert session.get(Attempt, attempt_id) is None
        report = workspaces.reconcile(session, engine.factory)
    assert report.placed == [] and engine.calls == []  # a host with room places nothing of it
    with ctx.session() as session:
        row = session.scalars(select(Workspace).where(Workspace.name == name)).one()
        assert row.status is WorkspaceStatus.DESTROYED and row.last_error == "attempt withdrawn"
        assert row.attempt_id is None


def test_a_launch_being_placed_or_an_attempt_started_is_not_withdrawn(
    ctx: Context, tmp_path: Path
) -> None:
    placing = make_attempt(ctx)
    _waiting_for_a_host(ctx, placing, WorkspaceStatus.CREATING)
    with pytest.raises(Conflict, match="being placed on a host now"):
        attempts.withdraw(ctx, placing, None, "too late")
    started = make_attempt(ctx)
    attempts.start(ctx, started, None, directory_resolver(tmp_path))
    with pytest.raises(Conflict, match=r"was launched \(running\): only an attempt never launched"):
        attempts.withdraw(ctx, started, None, "changed my mind")
    with ctx.session() as session:
        for attempt_id in (placing, started):
            assert session.get(Attempt, attempt_id) is not None
        row = session.scalars(select(Workspace).where(Workspace.attempt_id == placing)).one()
        assert row.status is WorkspaceStatus.CREATING
    assert _withdrawals(ctx) == []


def test_an_archived_studys_pending_attempt_stays_on_the_record(ctx: Context) -> None:
    attempt_id = make_attempt(ctx)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.PENDING
        study_id = attempt.study_id
    set_study_status(ctx, study_id, StudyStatus.ARCHIVED)
    with pytest.raises(Conflict, match="is archived"):
        attempts.withdraw(ctx, attempt_id, None, "tidy up")
    with ctx.session() as session:
        assert session.get(Attempt, attempt_id) is not None
