"""Reconcile and restart beside a destroy in another process: a destroyed workspace stays so.

No engine: a backend whose containers are names in a set, and a hook that runs another
process's destroy at the moment that matters. The database is what is checked (a conditional
UPDATE on SQLite and PostgreSQL alike), so these run on both.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from baseline.context import Context
from baseline.errors import Conflict
from baseline.models import Host, Workspace, WorkspacePurpose, WorkspaceStatus
from baseline.workspaces import workspaces
from tests.baseline.fake_engine import FakeEngine, destroyed


def _workspace(ctx: Context, status: WorkspaceStatus) -> str:
    """An attempt workspace on a healthy host, its row saying `status`; its name."""
    with ctx.session() as session:
        host = Host(name="engine", docker_url="unix:///run/engine.sock", healthy=True)
        session.add(host)
        session.flush()
        session.add(
            Workspace(
                purpose=WorkspacePurpose.ATTEMPT, backend="fake", name="ws-a1-race", image="img",
                hardware_profile="cpu", network="none", status=status, host_id=host.id,
                container_id="id-ws-a1-race", submission_volume="ws-a1-race-submission",
            )
        )  # fmt: skip
    return "ws-a1-race"


def _destroy_elsewhere(ctx: Context, engine: FakeEngine, name: str) -> None:
    """Another process ends the attempt and destroys its workspace, in its own transaction."""
    with ctx.session() as session:
        row = session.scalar(select(Workspace).where(Workspace.name == name))
        assert row is not None
        workspaces.destroy(session, row, engine.factory)


def _status(ctx: Context, name: str) -> WorkspaceStatus:
    with ctx.session() as session:
        row = session.scalar(select(Workspace).where(Workspace.name == name))
        assert row is not None
        return row.status


def test_reconcile_does_not_mark_dead_or_restart_a_workspace_destroyed_after_it_read_it(
    ctx: Context,
) -> None:
    """Reconcile reads the row running and finds no container: the attempt ended and another
    process destroyed the workspace between that read and reconcile's write. Reconcile wrote
    dead over destroyed and restarted it, making its container and volume again."""
    name = _workspace(ctx, WorkspaceStatus.RUNNING)
    engine = FakeEngine(name="fake")
    engine.on_status = lambda: _destroy_elsewhere(ctx, engine, name)
    with ctx.session() as session:
        report = workspaces.reconcile(session, engine.factory)
    assert engine.calls == destroyed(name)  # nothing made again
    assert (report.died, report.restarted, report.errors) == ([], [], {})
    assert _status(ctx, name) is WorkspaceStatus.DESTROYED


def test_reconcile_still_marks_dead_and_restarts_a_workspace_whose_container_died(
    ctx: Context,
) -> None:
    """The guard changes nothing when nobody else wrote the row: a dead container is made again."""
    name = _workspace(ctx, WorkspaceStatus.RUNNING)
    engine = FakeEngine(name="fake")
    with ctx.session() as session:
        report = workspaces.reconcile(session, engine.factory)
    assert engine.calls == [f"create {name}", f"start {name}"]
    assert (report.died, report.restarted, report.errors) == ([name], [name], {})
    assert _status(ctx, name) is WorkspaceStatus.RUNNING


def test_restart_refuses_a_workspace_destroyed_since_the_caller_read_it_dead(
    ctx: Context,
) -> None:
    """A caller read the workspace dead; another process destroyed it before the restart. The
    restart checked only what the caller had read and made the container again."""
    name = _workspace(ctx, WorkspaceStatus.DEAD)
    engine = FakeEngine(name="fake")
    with ctx.session() as session:
        row = session.scalar(select(Workspace).where(Workspace.name == name))
        assert row is not None and row.status is WorkspaceStatus.DEAD
        _destroy_elsewhere(ctx, engine, name)
        with pytest.raises(Conflict, match="is destroyed now, no longer dead; not restarting"):
            workspaces.restart(session, row, engine.factory)
    assert engine.calls == destroyed(name)
    assert _status(ctx, name) is WorkspaceStatus.DESTROYED


def test_a_workspace_an_agents_tool_call_found_gone_is_revived_unless_destroyed_meanwhile(
    ctx: Context,
) -> None:
    """The agent loop's restart after a failed tool call (`workspaces.revive`): it set the row
    dead whatever it said, so a workspace destroyed since the loop read it (the attempt ended)
    was made again. Now that raises Conflict and nothing is made; a workspace nobody else
    wrote is restarted as before."""
    name = _workspace(ctx, WorkspaceStatus.RUNNING)
    engine = FakeEngine(name="fake")
    with ctx.session() as session:
        row = session.scalar(select(Workspace).where(Workspace.name == name))
        assert row is not None
        _destroy_elsewhere(ctx, engine, name)
        with pytest.raises(Conflict, match="is destroyed; not reviving it"):
            workspaces.revive(session, row, "tool call failed", engine.factory)
    assert engine.calls == destroyed(name)
    assert _status(ctx, name) is WorkspaceStatus.DESTROYED

    other = FakeEngine(name="fake")
    with ctx.session() as session:
        host = session.scalar(select(Host))
        assert host is not None
        session.add(
            Workspace(
                purpose=WorkspacePurpose.ATTEMPT, backend="fake", name="ws-a2-gone", image="img",
                hardware_profile="cpu", network="none", status=WorkspaceStatus.RUNNING,
                host_id=host.id, container_id="id-ws-a2-gone",
                submission_volume="ws-a2-gone-submission",
            )
        )  # fmt: skip
    with ctx.session() as session:
        row = session.scalar(select(Workspace).where(Workspace.name == "ws-a2-gone"))
        assert row is not None
        workspaces.revive(session, row, "tool call failed", other.factory)
    assert other.calls == ["create ws-a2-gone", "start ws-a2-gone"]
    assert _status(ctx, "ws-a2-gone") is WorkspaceStatus.RUNNING
