"""A job's disposable workspace is destroyed once its job no longer holds it, even when the
destroy failed as the job ended, and never while a live runner uses it.

SQLite-only and without Docker: the engine is `FakeEngine`, which can be made to fail its
destroys (a host whose engine does not answer)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from baseline.context import Context
from baseline.grading import claims, grading_recovery, reproductions
from baseline.models import (
    Grading,
    GradingKind,
    Host,
    JobStatus,
    Reproduction,
    ScoreLog,
    Snapshot,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.workspaces.workspaces import request_workspace
from infra.workspace import WorkspaceError, WorkspaceHandle
from scoring.reproduction import ReproductionResult
from tests.baseline.fake_engine import FakeEngine
from tests.scoring.scoring_world import build_world, snapshot_reference

pytestmark = pytest.mark.sqlite_only("which workspaces a sweep destroys: rows and a fake engine")

AFTER_THE_GRACE = timedelta(seconds=claims.UNNAMED_GRACE_S + 1)


@dataclass
class UnansweringEngine(FakeEngine):
    """A fake engine whose destroys fail while `answering` is False (its host is down)."""

    answering: bool = True

    def destroy(self, handle: WorkspaceHandle, *, keep_submission: bool = False) -> None:
        if not self.answering:
            self.calls.append(f"failed to remove {handle.name}")
            raise WorkspaceError("the engine does not answer")
        super().destroy(handle, keep_submission=keep_submission)


@pytest.fixture
def engine(ctx: Context) -> UnansweringEngine:
    with ctx.session() as session:
        session.add(Host(name="engine", docker_url="unix:///run/engine.sock", healthy=True))
    return UnansweringEngine()


def _workspace(
    ctx: Context, engine: FakeEngine, purpose: WorkspacePurpose = WorkspacePurpose.REPRODUCTION
) -> str:
    """A disposable workspace placed on the engine and left standing (its job's process died
    before its end, or its destroy failed): its name."""
    with ctx.session() as session:
        workspace = request_workspace(
            session, image="img", hardware_profile="cpu", purpose=purpose,
            backend_factory=engine.factory,
        )  # fmt: skip
        assert workspace.status is WorkspaceStatus.RUNNING
        return workspace.name


def _status(ctx: Context, name: str) -> WorkspaceStatus:
    with ctx.session() as session:
        workspace = session.scalar(select(Workspace).where(Workspace.name == name))
        assert workspace is not None
        return workspace.status


def _snapshot(ctx: Context, tmp_path: Path) -> int:
    world = build_world(ctx, image_digest="sha256:" + "a" * 64)
    return snapshot_reference(ctx, world.attempt_id, tmp_path / "ref")


def _reproduction(ctx: Context, snapshot_id: int, status: JobStatus, workspace: str) -> int:
    with ctx.session() as session:
        row = Reproduction(
            snapshot_id=snapshot_id, status=status, details={"workspace": workspace},
            started_at=utcnow() if status is JobStatus.RUNNING else None,
            heartbeat_at=utcnow() if status is JobStatus.RUNNING else None,
        )  # fmt: skip
        session.add(row)
        session.flush()
        return row.id


def _sweep(ctx: Context, engine: FakeEngine, later: timedelta = timedelta()) -> list[str]:
    with ctx.session() as session:
        return claims.sweep_disposable(session, engine.factory, utcnow() + later)


def test_a_failed_destroy_as_the_job_ends_keeps_the_jobs_error_and_leaves_the_row_live(
    ctx: Context, engine: UnansweringEngine
) -> None:
    """The host's engine does not answer as the job ends: the destroy in the `finally` raised
    PlacementError, which hid the job's own error. Now the job's error is what the runner
    sees, and the workspace stays live, its GPUs held, for the sweep to destroy later."""
    engine.answering = False
    with (
        pytest.raises(RuntimeError, match="the job's own failure"),
        reproductions.disposable_workspace(
            ctx, image="img", hardware_profile="cpu", purpose=WorkspacePurpose.REPRODUCTION,
            network="none", backend_factory=engine.factory,
        ) as placed,
    ):  # fmt: skip
        name = placed.handle.name
        raise RuntimeError("the job's own failure")
    assert engine.calls[-1] == f"failed to remove {name}"
    assert _status(ctx, name) is WorkspaceStatus.RUNNING


def test_the_sweep_destroys_a_workspace_whose_job_ended_and_retries_while_its_engine_is_down(
    ctx: Context, engine: UnansweringEngine, tmp_path: Path
) -> None:
    """A reproduction ended but its workspace's destroy failed: nothing ever retried it (reconcile
    leaves disposable workspaces to their job, recovery only looks at running jobs), and its
    GPUs were gone from the pool for good. The sweep destroys it; while the engine still does
    not answer, the row stays live and the next sweep tries again."""
    name = _workspace(ctx, engine)
    _reproduction(ctx, _snapshot(ctx, tmp_path), JobStatus.SUCCEEDED, name)
    engine.answering = False
    assert _sweep(ctx, engine) == []
    assert _status(ctx, name) is WorkspaceStatus.RUNNING
    engine.answering = True
    assert _sweep(ctx, engine) == [name]
    assert _status(ctx, name) is WorkspaceStatus.DESTROYED
    assert engine.calls[-3:] == [
        f"failed to remove {name}", f"remove container {name}", f"remove volume {name}-submission"
    ]  # fmt: skip
    assert _sweep(ctx, engine) == []


def test_the_sweep_destroys_a_scoring_workspace_whose_grading_ended(
    ctx: Context, engine: UnansweringEngine, tmp_path: Path
) -> None:
    """As for reproductions, a grading's scoring workspace (named in its config)."""
    name = _workspace(ctx, engine, WorkspacePurpose.SCORING)
    with ctx.session() as session:
        session.add(
            Grading(
                snapshot_id=_snapshot(ctx, tmp_path), kind=GradingKind.SCRIPT,
                status=JobStatus.FAILED, config={"workspace": name},
            )
        )  # fmt: skip
    assert _sweep(ctx, engine) == [name]
    assert _status(ctx, name) is WorkspaceStatus.DESTROYED


def test_the_sweep_destroys_a_workspace_its_running_job_no_longer_names(
    ctx: Context, engine: UnansweringEngine, tmp_path: Path
) -> None:
    """A reproduction recovered and claimed again runs in a new workspace: the old one, its
    destroy having failed, is no longer its job's."""
    old, new = _workspace(ctx, engine), _workspace(ctx, engine)
    snapshot_id = _snapshot(ctx, tmp_path)
    _reproduction(ctx, snapshot_id, JobStatus.FAILED, old)  # an earlier run named it
    _reproduction(ctx, snapshot_id, JobStatus.RUNNING, new)
    assert _sweep(ctx, engine) == [old]
    assert _status(ctx, new) is WorkspaceStatus.RUNNING


def test_a_workspace_no_row_names_is_swept_only_after_the_grace(
    ctx: Context, engine: UnansweringEngine
) -> None:
    """A reproduction's runner that died between making its workspace and naming it on its row
    left it to nobody; so did an intermediate score before it named its scoring workspace on its
    row (the sweep left every unnamed scoring workspace alone, its GPUs held for good). A young
    one may be a live runner's that has not named it yet. An intermediate score's is its own
    while it runs, however old, and swept at once once it ended (its destroy failed then)."""
    attempt_id = build_world(ctx).attempt_id
    reproduction = _workspace(ctx, engine)
    unnamed = _workspace(ctx, engine, WorkspacePurpose.SCORING)
    scoring = _workspace(ctx, engine, WorkspacePurpose.SCORING)
    ended = _workspace(ctx, engine, WorkspacePurpose.SCORING)
    with ctx.session() as session:
        for status, name in ((JobStatus.RUNNING, scoring), (JobStatus.FAILED, ended)):
            row = ScoreLog(attempt_id=attempt_id, working_s=60.0, status=status, workspace=name)
            session.add(row)
    assert _sweep(ctx, engine) == [ended]
    assert _sweep(ctx, engine, later=AFTER_THE_GRACE) == [reproduction, unnamed]
    assert _status(ctx, scoring) is WorkspaceStatus.RUNNING


def test_the_sweep_never_destroys_the_workspace_of_a_live_runner(
    ctx: Context, engine: UnansweringEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep while a reproduction runs (however late it seems) leaves its workspace alone;
    the runner destroys it when it ends."""
    snapshot_id = _snapshot(ctx, tmp_path)
    with ctx.session() as session:
        snapshot = session.get(Snapshot, snapshot_id)
        assert snapshot is not None
        reproduction_id = reproductions.queue_reproduction(session, snapshot).id
    swept: list[list[str]] = []

    def reproduce(_backend: Any, handle: WorkspaceHandle, *_args: Any, **_kwargs: Any) -> Any:
        swept.append(_sweep(ctx, engine, later=AFTER_THE_GRACE))
        assert handle.name in engine.containers
        return ReproductionResult(
            reproduce_sh_present=True, exit_code=0, timed_out=False, duration_s=1.0,
            log_sha256="0" * 64, log_bytes_total=0, log_truncated=False, files_before=[],
            files_after=[], added=[], removed=[], changed=[], git_status="",
            executed_manifest_sha256="1" * 64,
        )  # fmt: skip

    monkeypatch.setattr(reproductions, "reproduce_in_workspace", reproduce)
    row = reproductions.run_reproduction(ctx, reproduction_id, backend_factory=engine.factory)
    assert row.status is JobStatus.SUCCEEDED, row.error
    assert swept == [[]]
    name = row.details["workspace"]
    assert _status(ctx, name) is WorkspaceStatus.DESTROYED
    assert engine.calls.count(f"remove container {name}") == 1


def test_the_gradings_recovery_job_sweeps(
    ctx: Context, engine: UnansweringEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep runs every minute, with the gradings' recovery (the scheduler's periodic job)."""
    name = _workspace(ctx, engine)
    _reproduction(ctx, _snapshot(ctx, tmp_path), JobStatus.FAILED, name)
    monkeypatch.setattr(grading_recovery, "backend_for_host", engine.factory)
    assert grading_recovery.recover_job(ctx) == []
    assert _status(ctx, name) is WorkspaceStatus.DESTROYED
