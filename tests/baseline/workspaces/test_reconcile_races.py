"""Reconcile, restart and placement beside a destroy, a stop or another placement in another
process: a destroyed workspace stays destroyed, a stopped one stopped, a placed one placed once.

No engine: a backend whose containers are names in a set, and a hook that runs another
process's destroy, or a reconcile in another thread, at the moment that matters. The database
is what is checked (a conditional UPDATE on SQLite and PostgreSQL alike), so these run on both.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.context import Context
from baseline.errors import Conflict
from baseline.models import GpuAssignment, Host, Workspace, WorkspacePurpose, WorkspaceStatus
from baseline.workspaces import gpu_allocation, workspaces
from infra.workspace import WorkspaceError
from tests.baseline.fake_engine import FakeEngine, destroyed
from tests.db_writes import recording_writes

# How long an engine call waits for the reconcile it started beside it: one that nothing holds
# back finishes in milliseconds; one the row holds back waits for the call's transaction.
HOLD_S = 0.5

T = TypeVar("T")


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


class _Meanwhile(Generic[T]):
    """Another process's `job`, in another thread and its own transaction, started by the
    engine in the middle of a stop or a destroy (`FakeEngine.meanwhile`, once), or of a
    placement once its container is made (`FakeEngine.on_create`, with `at_create`); the call
    goes on once the job finished or HOLD_S passed."""

    def __init__(
        self,
        ctx: Context,
        engine: FakeEngine,
        job: Callable[[Session], T],
        *,
        at_create: bool = False,
    ) -> None:
        self._ctx, self._engine, self._job = ctx, engine, job
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._done: Future[T] | None = None
        if at_create:
            engine.on_create = self._start
        else:
            engine.meanwhile = self._start

    def _start(self) -> None:
        self._engine.meanwhile = lambda: None
        self._done = self._pool.submit(self._run)
        wait([self._done], timeout=HOLD_S)

    def _run(self) -> T:
        with self._ctx.session() as session:
            return self._job(session)

    def report(self) -> T:
        """What the job returned, once it ended (its error raised here, if it had one)."""
        assert self._done is not None, "the engine call never started the job"
        try:
            return self._done.result(timeout=60)
        finally:
            self._pool.shutdown()


def _reconcile_meanwhile(
    ctx: Context, engine: FakeEngine, *, at_create: bool = False
) -> _Meanwhile[workspaces.ReconcileReport]:
    """The scheduler's reconcile, run as `_Meanwhile` runs its job."""
    return _Meanwhile(
        ctx, engine, lambda session: workspaces.reconcile(session, engine.factory),
        at_create=at_create,
    )  # fmt: skip


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
    beside = _reconcile_meanwhile(ctx, engine)
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
    beside = _reconcile_meanwhile(ctx, engine)
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


def _pending_workspace(ctx: Context, hardware_profile: str = "cpu") -> str:
    """An attempt workspace never placed, its row PENDING, and a healthy host with one A10 free;
    its name."""
    with ctx.session() as session:
        session.add(
            Host(
                name="engine", docker_url="unix:///run/engine.sock", healthy=True,
                gpus=[{"index": 0, "uuid": "GPU-0", "model": "NVIDIA A10"}], gpus_declared=True,
            )
        )  # fmt: skip
        session.add(
            Workspace(
                purpose=WorkspacePurpose.ATTEMPT, backend="fake", name="ws-a1-race", image="img",
                hardware_profile=hardware_profile, network="none", status=WorkspaceStatus.PENDING,
            )
        )  # fmt: skip
    return "ws-a1-race"


_ENDS = pytest.mark.parametrize(
    ("end", "ended"),
    [(workspaces.destroy, WorkspaceStatus.DESTROYED), (workspaces.stop, WorkspaceStatus.STOPPED)],
    ids=["destroy", "stop"],
)


@_ENDS
def test_place_leaves_a_workspace_stopped_or_destroyed_since_the_caller_read_it_pending(
    ctx: Context,
    end: Callable[[Session, Workspace, workspaces.BackendFactory], None],
    ended: WorkspaceStatus,
) -> None:
    """Reconcile read the workspace pending; another process ended its attempt and stopped or
    destroyed it before reconcile placed it. The placement wrote creating, then running, over
    the row whatever it said, took its GPU and made its container: a workspace meant over ran
    again. Now it finds the row no longer pending and does nothing."""
    name = _pending_workspace(ctx, hardware_profile="a10")
    engine = FakeEngine(name="fake")
    with ctx.session() as session:
        row = _row(session, name)
        assert row.status is WorkspaceStatus.PENDING
        with ctx.session() as elsewhere:
            end(elsewhere, _row(elsewhere, name), engine.factory)
        assert workspaces.place(session, row, engine.factory) is False
        assert row.status is ended  # what the row says now
    assert engine.calls == []  # no container made
    assert _status(ctx, name) is ended
    with ctx.session() as session:
        assert session.scalars(select(GpuAssignment)).all() == []  # no GPU taken


def test_two_reconciles_placing_one_pending_workspace_make_one_container(ctx: Context) -> None:
    """Two reconciles (the portal's scheduler and a CLI's, say) read the same workspace pending.
    The second wrote creating over the first's placement once that committed and made a second
    container for one row. Now the second waits for the first's claim, finds the workspace
    placed and leaves it."""
    name = _pending_workspace(ctx)
    engine = FakeEngine(name="fake")
    beside = _reconcile_meanwhile(ctx, engine, at_create=True)
    with ctx.session() as session:
        first = workspaces.reconcile(session, engine.factory)
    second = beside.report()
    assert engine.calls == [f"create {name}", f"start {name}"]  # one container
    assert (first.placed, second.placed, second.errors) == ([name], [], {})
    assert _status(ctx, name) is WorkspaceStatus.RUNNING


@_ENDS
def test_a_stop_or_destroy_while_reconcile_makes_the_container_acts_on_the_placed_workspace(
    ctx: Context,
    end: Callable[[Session, Workspace, workspaces.BackendFactory], None],
    ended: WorkspaceStatus,
) -> None:
    """Another process stops or destroys the workspace while reconcile makes its container.
    The placement's claim holds the row until it commits, container made and row running: the
    stop or destroy waits for it, then stops or removes that container. Had the placement
    committed creating before making the container, the destroy would have found none, and
    the placement written running over destroyed beside a container nobody owns."""
    name = _pending_workspace(ctx)
    engine = FakeEngine(name="fake")
    beside = _Meanwhile(
        ctx, engine, lambda session: end(session, _row(session, name), engine.factory),
        at_create=True,
    )  # fmt: skip
    with ctx.session() as session:
        report = workspaces.reconcile(session, engine.factory)
    beside.report()
    after = [f"stop {name}"] if ended is WorkspaceStatus.STOPPED else destroyed(name)
    assert engine.calls == [f"create {name}", f"start {name}", *after]
    assert report.placed == [name]
    assert _status(ctx, name) is ended


def test_reconcile_commits_each_placement_before_making_the_next_container(ctx: Context) -> None:
    """Two pending workspaces: while reconcile makes the second one's container, the first one
    is running for every other connection. Reconcile placed them all in one transaction, and
    on SQLite its first write held the database's write lock through every engine call that
    followed: a study launched onto full hosts held back the portal's every write for the sum
    of its placements, and a write that waited the busy timeout (30 s) failed."""
    first = _pending_workspace(ctx)
    with ctx.session() as session:
        session.add(
            Workspace(
                purpose=WorkspacePurpose.ATTEMPT, backend="fake", name="ws-a2-next", image="img",
                hardware_profile="cpu", network="none", status=WorkspaceStatus.PENDING,
            )
        )  # fmt: skip
    engine = FakeEngine(name="fake")
    seen: list[WorkspaceStatus] = []
    engine.on_create = lambda: setattr(
        engine, "on_create", lambda: seen.append(_status(ctx, first))
    )
    with ctx.session() as session:
        report = workspaces.reconcile(session, engine.factory)
    assert report.placed == [first, "ws-a2-next"]
    assert seen == [WorkspaceStatus.RUNNING]


def test_a_workspace_waiting_for_gpus_is_not_written_by_each_reconcile(ctx: Context) -> None:
    """The host's one A10 is another workspace's: each reconcile claimed the waiting workspace
    (creating), found no room and wrote it pending again, two writes of its row a minute, each
    followed by the pause that lets the portal's writers in. Now a read finds no room first and
    nothing is written; once the GPU is free, the next reconcile places it."""
    name = _pending_workspace(ctx, hardware_profile="a10")
    with ctx.session() as session:
        host = session.scalars(select(Host)).one()
        holder = Workspace(
            purpose=WorkspacePurpose.ATTEMPT, backend="fake", name="ws-a9-holder", image="img",
            hardware_profile="a10", network="none", status=WorkspaceStatus.STOPPED,
            host_id=host.id,
        )  # fmt: skip
        session.add(holder)
        session.flush()
        session.add(
            GpuAssignment(host_id=host.id, device_index=0, gpu_uuid="GPU-0", workspace_id=holder.id)
        )
    engine = FakeEngine(name="fake")
    with recording_writes(ctx.engine) as written, ctx.session() as session:
        report = workspaces.reconcile(session, engine.factory)
    assert (report.placed, written, engine.calls) == ([], [], [])
    assert _status(ctx, name) is WorkspaceStatus.PENDING
    with ctx.session() as session:
        gpu_allocation.release(session, _row(session, "ws-a9-holder"))
    with ctx.session() as session:
        assert workspaces.reconcile(session, engine.factory).placed == [name]
