"""Moving an attempt off a lost host beside another process that writes its old workspace: the
old one is retired only as the move read it, or the move undoes itself.

No engine: the fake one (`tests.baseline.fake_engine`), which records its calls. The move's read of
the old workspace is made first and held, another process writes it in its own transaction, then
the move runs on what it read; the database's conditional UPDATE is what is checked,
so these run on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.attempts import host_outage, snapshots
from baseline.context import Context
from baseline.errors import Conflict
from baseline.models import (
    Attempt,
    AttemptStatus,
    AuditEvent,
    EgressPolicy,
    Host,
    Snapshot,
    SnapshotKind,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.workspaces import workspaces
from infra.workspace import WorkspaceHandle
from tests.baseline.attempt_world import make_attempt
from tests.baseline.fake_engine import FakeEngine

OLD = "ws-old-lost"


@dataclass
class RestoringEngine(FakeEngine):
    """The fake engine, able to receive the snapshot a move restores into a new workspace."""

    def put_archive(self, handle: WorkspaceHandle, path: str, archive: IO[bytes]) -> None:
        self.calls.append(f"restore {handle.name} {path}")


def _attempt_on_lost_host(ctx: Context, tmp_path: Path, status: WorkspaceStatus) -> int:
    """A running attempt with a snapshot, its workspace (`OLD`, row saying `status`) on the
    host `lost`, and a healthy host `spare` to move to; the attempt's id."""
    attempt_id = make_attempt(ctx)
    (tmp_path / "notes.txt").write_text("captured")
    snapshots.take_snapshot(
        ctx, attempt_id, SnapshotKind.MANUAL, None, snapshots.DirectorySource(str(tmp_path))
    )
    with ctx.session() as session:
        lost = Host(name="lost", docker_url="ssh://root@lost", healthy=False)
        spare = Host(name="spare", docker_url="ssh://root@spare", healthy=True)
        session.add_all([lost, spare])
        session.flush()
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.status = AttemptStatus.RUNNING
        attempt.study.egress_policy = EgressPolicy.NONE  # no egress proxy to start
        session.add(
            Workspace(
                attempt_id=attempt_id, purpose=WorkspacePurpose.ATTEMPT, backend="fake", name=OLD,
                image="img", hardware_profile="cpu", network="none", status=status,
                host_id=lost.id, container_id=f"id-{OLD}", submission_volume=f"{OLD}-submission",
            )
        )  # fmt: skip
    return attempt_id


def _workspaces(ctx: Context, attempt_id: int) -> dict[str, WorkspaceStatus]:
    with ctx.session() as session:
        rows = session.scalars(select(Workspace).where(Workspace.attempt_id == attempt_id))
        return {row.name: row.status for row in rows}


def _assert_undone(ctx: Context, attempt_id: int, engine: FakeEngine, left: WorkspaceStatus) -> str:
    """The move made its new workspace, restored the snapshot there, then destroyed it, volume
    and all, leaving the old one `left`; the new one's name."""
    (new,) = set(_workspaces(ctx, attempt_id)) - {OLD}
    assert engine.calls == [
        f"create {new}",
        f"start {new}",
        f"restore {new} /home",
        f"remove container {new}",
        f"remove volume {new}-submission",
    ]
    assert _workspaces(ctx, attempt_id) == {OLD: left, new: WorkspaceStatus.DESTROYED}
    return new


def _restart_elsewhere(ctx: Context, engine: FakeEngine) -> None:
    """The lost host answers again: the scheduler's reconcile restarts the dead workspace."""
    with ctx.session() as session:
        lost = session.scalar(select(Host).where(Host.name == "lost"))
        assert lost is not None
        lost.healthy = True
        report = workspaces.reconcile(session, engine.factory)
        assert report.restarted == [OLD], report


def _destroy_elsewhere(ctx: Context, engine: FakeEngine) -> None:
    """The attempt ends in another process, which destroys its workspace."""
    with ctx.session() as session:
        old = session.scalar(select(Workspace).where(Workspace.name == OLD))
        assert old is not None
        workspaces.destroy(session, old, engine.factory)


@pytest.mark.parametrize(
    ("seen", "meanwhile", "left"),
    [
        (WorkspaceStatus.DEAD, _restart_elsewhere, WorkspaceStatus.RUNNING),
        (WorkspaceStatus.RUNNING, _destroy_elsewhere, WorkspaceStatus.DESTROYED),
    ],
    ids=["restarted-meanwhile", "destroyed-meanwhile"],
)
def test_a_move_whose_old_workspace_was_written_meanwhile_undoes_itself(
    ctx: Context,
    tmp_path: Path,
    seen: WorkspaceStatus,
    meanwhile: Callable[[Context, FakeEngine], None],
    left: WorkspaceStatus,
) -> None:
    """The move wrote destroyed over the old workspace whatever its row said: one that reconcile
    restarted meanwhile (its host came back) ran on beside the new one, two live workspaces for
    one attempt, and one destroyed meanwhile (its attempt ended) left the new one running for an
    ended attempt. Now the old one stays as the other process left it, the new one is destroyed
    and the move says why."""
    attempt_id = _attempt_on_lost_host(ctx, tmp_path, seen)
    engine = RestoringEngine(name="fake")
    with ctx.session() as session:
        lost = session.scalar(select(Host).where(Host.name == "lost"))
        assert lost is not None
        (attempt,) = host_outage.attempts_on(session, lost)
        # The move's read of the old workspace, held as it is while the move places the new one
        # (minutes on a real host; on SQLite the move's first write would hold the other back).
        read = host_outage.attempt_workspace(session, attempt)
        assert read is not None and read.status is seen
        meanwhile(ctx, engine)
        engine.calls.clear()
        with pytest.raises(Conflict, match=f"not moved: its workspace {OLD} became {left.value}"):
            host_outage.move_attempt(ctx, session, attempt, backend_factory=engine.factory)
    _assert_undone(ctx, attempt_id, engine, left)


def test_a_move_nobody_interferes_with_retires_the_old_workspace(
    ctx: Context, tmp_path: Path
) -> None:
    """The conditional retirement changes nothing when nobody else wrote the old workspace."""
    attempt_id = _attempt_on_lost_host(ctx, tmp_path, WorkspaceStatus.RUNNING)
    engine = RestoringEngine(name="fake")
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        new = host_outage.move_attempt(ctx, session, attempt, backend_factory=engine.factory)
        name = new.name
        old = session.scalar(select(Workspace).where(Workspace.name == OLD))
        assert old is not None and old.last_error is not None
        assert old.last_error.startswith("moved to spare")
    assert engine.calls == [f"create {name}", f"start {name}", f"restore {name} /home"]
    assert _workspaces(ctx, attempt_id) == {
        OLD: WorkspaceStatus.DESTROYED,
        name: WorkspaceStatus.RUNNING,
    }


def _end_elsewhere(ctx: Context, _engine: FakeEngine) -> None:
    """The attempt ends in another process (its wall-clock cap, a coordinator); its workspace
    on the lost host does not answer, so the end leaves it dead."""
    with ctx.session() as session:
        old = session.scalar(select(Workspace).where(Workspace.name == OLD))
        assert old is not None and old.attempt_id is not None
        attempt = session.get(Attempt, old.attempt_id)
        assert attempt is not None
        attempt.status = AttemptStatus.ENDED


def _audited_destroy(ctx: Context, name: str) -> bool:
    with ctx.session() as session:
        row = session.scalar(select(Workspace).where(Workspace.name == name))
        assert row is not None
        return (
            session.scalar(
                select(AuditEvent.id).where(
                    AuditEvent.action == "workspace.destroy", AuditEvent.target_id == str(row.id)
                )
            )
            is not None
        )


@pytest.mark.parametrize(
    ("seen", "meanwhile", "left", "said"),
    [
        (
            WorkspaceStatus.DEAD,
            _end_elsewhere,
            WorkspaceStatus.DEAD,
            "it ended while it was moving",
        ),
        (
            WorkspaceStatus.RUNNING,
            _destroy_elsewhere,
            WorkspaceStatus.DESTROYED,
            f"its workspace {OLD} became destroyed while it was moving \\(it was running\\)",
        ),
    ],
    ids=["attempt-ended-meanwhile", "destroyed-meanwhile"],
)
def test_a_coordinators_move_that_loses_a_race_keeps_its_destroyed_workspace_on_record(
    ctx: Context,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    seen: WorkspaceStatus,
    meanwhile: Callable[[Context, FakeEngine], None],
    left: WorkspaceStatus,
    said: str,
) -> None:
    """Two defects of the coordinator's move (portal, CLI). An attempt that ended while the move
    ran left its lost workspace dead (its end cannot reach it), so the move retired it and the
    new workspace ran on for an ended attempt, holding its GPUs; now the move finds the attempt
    ended and undoes itself. And a move that lost its race raised inside its transaction, which
    rolled back the new workspace's row and audit entries though its container had been made
    and removed on the engine; now they stay on record."""
    attempt_id = _attempt_on_lost_host(ctx, tmp_path, seen)
    engine = RestoringEngine(name="fake")
    latest = host_outage.latest_snapshot

    def meanwhile_then_latest(session: Session, attempt: Attempt) -> Snapshot | None:
        meanwhile(ctx, engine)  # after the move read the attempt and its workspace
        engine.calls.clear()
        return latest(session, attempt)

    monkeypatch.setattr(host_outage, "latest_snapshot", meanwhile_then_latest)
    with pytest.raises(Conflict, match=f"attempt {attempt_id} not moved: {said}; the new"):
        host_outage.move(ctx, attempt_id, None, None, backend_factory=engine.factory)
    new = _assert_undone(ctx, attempt_id, engine, left)
    assert _audited_destroy(ctx, new)
