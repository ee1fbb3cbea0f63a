"""Reconcile and restart beside a destroy or a stop in another process: a destroyed workspace
stays destroyed, a stopped one stopped.

No engine: a backend whose containers are names in a set, and a hook that runs another
process's destroy, or a reconcile in another thread, at the moment that matters. The database
is what is checked (a conditional UPDATE on SQLite and PostgreSQL alike), so these run on both.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.context import Context
from baseline.errors import Conflict
from baseline.models import Host, Workspace, WorkspacePurpose, WorkspaceStatus
from baseline.workspaces import workspaces
from infra.workspace import WorkspaceError
from tests.baseline.fake_engine import FakeEngine, destroyed

# How long an engine call waits for the reconcile it started beside it: one that nothing holds
# back finishes in milliseconds; one the row holds back waits for the call's transaction.
HOLD_S = 0.5


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


class _ReconcileMeanwhile:
    """The scheduler's reconcile, in another thread and its own transaction, started by the
    engine in the middle of a stop or a destroy (`FakeEngine.meanwhile`, once); the call goes
    on once the reconcile finished or HOLD_S passed."""

    def __init__(self, ctx: Context, engine: FakeEngine) -> None:
        self._ctx, self._engine = ctx, engine
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._done: Future[workspaces.ReconcileReport] | None = None
        engine.meanwhile = self._start

    def _start(self) -> None:
        self._engine.meanwhile = lambda: None
        self._done = self._pool.submit(self._reconcile)
        wait([self._done], timeout=HOLD_S)

    def _reconcile(self) -> workspaces.ReconcileReport:
        with self._ctx.session() as session:
            return workspaces.reconcile(session, self._engine.factory)

    def report(self) -> workspaces.ReconcileReport:
        """What the reconcile did, once it ended (its error raised here, if it had one)."""
        assert self._done is not None, "the engine call never started the reconcile"
        try:
            return self._done.result(timeout=60)
        finally:
            self._pool.shutdown()


def _row(session: Session, name: str) -> Workspace:
    row = session.scalar(select(Workspace).where(Workspace.name == name))
    assert row is not None
    return row


def test_a_reconcile_while_a_destroy_removes_the_container_leaves_the_workspace_destroyed(
    ctx: Context,
) -> None:
    """The destroy removed the container, then wrote the row: a reconcile in between read the
    row running and found no container, marked it dead and restarted it, its container and
    volume made again beside a row that then said destroyed (orphans until a later reconcile).
    Now the row says destroyed first: the reconcile waits for it and leaves the workspace."""
    name = _workspace(ctx, WorkspaceStatus.RUNNING)
    engine = FakeEngine(name="fake", containers={name})
    beside = _ReconcileMeanwhile(ctx, engine)
    _destroy_elsewhere(ctx, engine, name)
    report = beside.report()
    assert engine.calls == destroyed(name)  # nothing made again
    assert (report.died, report.restarted, report.errors) == ([], [], {})
    assert _status(ctx, name) is WorkspaceStatus.DESTROYED


def test_a_reconcile_while_a_stop_stops_the_container_leaves_the_workspace_stopped(
    ctx: Context,
) -> None:
    """The stop stopped the container, then wrote the row: a reconcile in between read the row
    running and found the container exited, marked it dead and started it again, so a workspace
    meant stopped (its attempt ended) ran on, its GPUs held by its container. Now the row says
    stopped first: the reconcile waits for it and leaves the workspace."""
    name = _workspace(ctx, WorkspaceStatus.RUNNING)
    engine = FakeEngine(name="fake", containers={name})
    beside = _ReconcileMeanwhile(ctx, engine)
    with ctx.session() as session:
        workspaces.stop(session, _row(session, name), engine.factory)
    report = beside.report()
    assert engine.calls == [f"stop {name}"]  # not started again
    assert (report.died, report.restarted, report.errors) == ([], [], {})
    assert _status(ctx, name) is WorkspaceStatus.STOPPED


def test_stop_leaves_a_workspace_destroyed_since_the_caller_read_it(ctx: Context) -> None:
    """A stop wrote stopped over a row another process had destroyed since the caller read it:
    a destroyed workspace was live again. It stays destroyed; its container went with it."""
    name = _workspace(ctx, WorkspaceStatus.RUNNING)
    engine = FakeEngine(name="fake", containers={name})
    with ctx.session() as session:
        row = _row(session, name)
        _destroy_elsewhere(ctx, engine, name)
        workspaces.stop(session, row, engine.factory)
    assert engine.calls == destroyed(name)
    assert _status(ctx, name) is WorkspaceStatus.DESTROYED


def _engine_fails() -> None:
    raise WorkspaceError("engine gone")


@pytest.mark.parametrize(
    ("end", "failure"),
    [(workspaces.destroy, "destroying"), (workspaces.stop, "stopping")],
    ids=["destroy", "stop"],
)
def test_a_destroy_or_stop_the_engine_failed_leaves_the_row_as_it_was(
    ctx: Context,
    end: Callable[[Session, Workspace, workspaces.BackendFactory], None],
    failure: str,
) -> None:
    """The row says destroyed or stopped before the engine is asked; when the engine fails it
    says running again, committed by a caller that goes on (the grading round's tries again
    next time; a row left destroyed beside its container would be taken for done)."""
    name = _workspace(ctx, WorkspaceStatus.RUNNING)
    engine = FakeEngine(name="fake", containers={name}, meanwhile=_engine_fails)
    failed = pytest.raises(workspaces.PlacementError, match=f"{failure} {name} failed")
    with ctx.session() as session, failed:  # the caller goes on and commits
        end(session, _row(session, name), engine.factory)
    assert _status(ctx, name) is WorkspaceStatus.RUNNING
