"""A grading runs once at a time (a claim), beats a heartbeat, and is taken over when silent.

SQLite-only and without Docker: the scoring workspace and the scoring script are stand-ins; what
is checked is who may run a grading and what each runner may write."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from baseline.cli import cli
from baseline.cli import scoring as scoring_cli
from baseline.context import Context
from baseline.errors import Conflict
from baseline.grading import claims, grading_recovery, reproductions, script_scoring
from baseline.jobs import orchestration
from baseline.models import (
    Attempt,
    Grading,
    GradingKind,
    JobStatus,
    Snapshot,
    Task,
    TaskKind,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.workspaces.workspaces import BackendFactory
from infra.snapshots import Manifest, load_manifest
from scoring.scoring_run import ScoringFailure, ScoringResult
from tests.scoring.scoring_world import build_world, snapshot_reference

pytestmark = pytest.mark.sqlite_only("who may run a grading: rows and stand-ins, no engine")

WORKSPACE = "ws-scoring-stand-in"  # the first placement's name; later ones are numbered


def _scored(raw: float) -> ScoringResult:
    return ScoringResult(raw_score=raw, normalised_score=raw, exit_code=0)


@contextmanager
def _stand_in_workspace(
    ctx: Context, on_named: Callable[[str], None] | None = None, **_kwargs: object
) -> Iterator[reproductions.Placed]:
    """Stands for a placed scoring workspace: named first (`on_named`), its row while the scoring
    runs, removed after it (not when the runner is killed inside: nothing after the yield runs
    then)."""
    with ctx.session() as session:
        placed_before = session.scalars(select(Workspace.id)).all()
    name = f"{WORKSPACE}-{len(placed_before)}" if placed_before else WORKSPACE
    if on_named is not None:
        on_named(name)
    with ctx.session() as session:
        row = Workspace(
            purpose=WorkspacePurpose.SCORING,
            backend="docker",
            name=name,
            image="sha256:" + "a" * 64,
            hardware_profile="cpu",
            status=WorkspaceStatus.RUNNING,
        )
        session.add(row)
        session.flush()
        workspace_id = row.id
    yield reproductions.Placed(workspace_id, object(), SimpleNamespace(name=name))  # type: ignore[arg-type]
    with ctx.session() as session:
        placed = session.get(Workspace, workspace_id)
        assert placed is not None
        placed.status = WorkspaceStatus.DESTROYED


def _queued_script_grading(ctx: Context, tmp_path: Path) -> int:
    """A queued script grading of a snapshot of the demo's scored task."""
    world = build_world(ctx, image_digest="sha256:" + "a" * 64)
    with ctx.session() as session:
        scored = session.scalars(select(Task).where(Task.kind == TaskKind.SCORED)).first()
        attempt = session.get(Attempt, world.attempt_id)
        assert scored is not None and attempt is not None
        attempt.task_id = scored.id
    snapshot_id = snapshot_reference(ctx, world.attempt_id, tmp_path / "ref")
    with ctx.session() as session:
        snapshot = session.get(Snapshot, snapshot_id)
        assert snapshot is not None
        return script_scoring.create_script_grading(session, snapshot).id


def _grading(ctx: Context, grading_id: int) -> Grading:
    with ctx.session() as session:
        row = session.get(Grading, grading_id)
        assert row is not None
        return row


def _back_off_over(ctx: Context, grading_id: int) -> None:
    with ctx.session() as session:
        row = session.get(Grading, grading_id)
        assert row is not None
        row.retry_at = None


@pytest.fixture
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script_scoring, "disposable_workspace", _stand_in_workspace)


def test_a_second_runner_that_read_the_script_grading_queued_does_not_score_it_again(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand_ins: None
) -> None:
    """The scheduler's worker and `baseline score` both read the grading queued; the second one
    scores it to its end between the first one's read and its write. Both placed a scoring
    workspace and ran the script; now the first one finds it claimed and is told so."""
    grading_id = _queued_script_grading(ctx, tmp_path)
    scorings: list[str] = []
    refused: list[str] = []
    runners: list[str] = []

    def second_runner_meanwhile(store: Any, sha256: str) -> Manifest:
        if not runners:  # the first runner, between its read and its write
            runners.append("second")
            second = script_scoring.run_script_grading(ctx, grading_id)
            assert second.status is JobStatus.SUCCEEDED
        return load_manifest(store, sha256)

    def score(*_args: object, **_kwargs: object) -> ScoringResult:
        scorings.append("scored")
        return _scored(0.5)

    monkeypatch.setattr(script_scoring, "load_manifest", second_runner_meanwhile)
    monkeypatch.setattr(script_scoring, "score_in_workspace", score)
    try:
        script_scoring.run_script_grading(ctx, grading_id)
    except Conflict as exc:  # claims.NotQueued
        refused.append(str(exc))
    assert scorings == ["scored"]
    assert refused == [f"grading {grading_id} is succeeded, not queued"]
    row = _grading(ctx, grading_id)
    assert (row.status, row.score, row.tries) == (JobStatus.SUCCEEDED, 0.5, 0)


class _Killed(BaseException):
    """The runner's process dies mid-scoring: nothing after this line of it runs."""


def _killed_while_scoring(
    ctx: Context, grading_id: int, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """Run the grading and kill its runner while the script runs (the grading left running, its
    scoring workspace standing); the names of the workspaces recovery destroys after that."""
    destroyed: list[str] = []

    def die(*_args: object, **_kwargs: object) -> ScoringResult:
        raise _Killed

    def destroy(session: Session, workspace: Workspace, _factory: BackendFactory) -> None:
        destroyed.append(workspace.name)
        workspace.status = WorkspaceStatus.DESTROYED

    monkeypatch.setattr(script_scoring, "score_in_workspace", die)
    monkeypatch.setattr(claims, "destroy", destroy)
    with pytest.raises(_Killed):
        script_scoring.run_script_grading(ctx, grading_id)
    return destroyed


def test_a_script_grading_whose_runner_died_is_recovered_and_scored_by_the_next_run(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand_ins: None
) -> None:
    """The worker was killed while the script ran: the grading stayed running for good, its
    scoring workspace standing. Once silent past the stale time it is queued again as a failed
    try of Baseline's own, the workspace removed, and the next run scores it."""
    grading_id = _queued_script_grading(ctx, tmp_path)
    destroyed = _killed_while_scoring(ctx, grading_id, monkeypatch)
    dead = _grading(ctx, grading_id)
    assert dead.status is JobStatus.RUNNING and dead.config["workspace"] == WORKSPACE
    assert grading_recovery.recover_interrupted(ctx) == []  # not silent long enough yet

    later = utcnow() + timedelta(seconds=claims.STALE_AFTER_S + 1)
    assert grading_recovery.recover_interrupted(ctx, now=later) == [grading_id]
    assert destroyed == [WORKSPACE]
    requeued = _grading(ctx, grading_id)
    assert (requeued.status, requeued.tries, requeued.started_at) == (JobStatus.QUEUED, 1, None)
    assert (requeued.error or "").startswith("try 1 of 3 failed (interrupted: its process stopped")

    _back_off_over(ctx, grading_id)
    monkeypatch.setattr(script_scoring, "score_in_workspace", lambda *_a, **_k: _scored(0.75))
    done = script_scoring.run_script_grading(ctx, grading_id)
    assert (done.status, done.score, done.tries) == (JobStatus.SUCCEEDED, 0.75, 1)
    assert grading_recovery.recover_interrupted(ctx, now=later) == []


def test_a_taken_over_script_runner_writes_nothing_over_the_next_run(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand_ins: None
) -> None:
    """A runner silent past the stale time but still alive: recovery queued the grading again
    and another runner claimed it. While that one scores, a third is refused as "already
    running"; the first runner's late result (no score) is not written over the second's."""
    grading_id = _queued_script_grading(ctx, tmp_path)
    outcomes: list[str] = []

    def score(*_args: object, **_kwargs: object) -> ScoringResult:
        if outcomes:  # the second runner, while it scores: a third one is refused
            with pytest.raises(Conflict, match="running") as third:
                script_scoring.run_script_grading(ctx, grading_id)
            outcomes.append(str(third.value))
            return _scored(0.9)
        later = utcnow() + timedelta(seconds=claims.STALE_AFTER_S + 1)
        assert grading_recovery.recover_interrupted(ctx, now=later) == [grading_id]
        _back_off_over(ctx, grading_id)
        outcomes.append("taken over")
        second = script_scoring.run_script_grading(ctx, grading_id)
        assert (second.status, second.score) == (JobStatus.SUCCEEDED, 0.9)
        return ScoringResult(failure=ScoringFailure.NO_SCORE, message="late")  # the first's

    monkeypatch.setattr(script_scoring, "score_in_workspace", score)
    monkeypatch.setattr(claims, "destroy", lambda *_args: None)
    first = script_scoring.run_script_grading(ctx, grading_id)
    assert (first.status, first.score, first.floor_reason, first.tries) == (
        JobStatus.SUCCEEDED,
        0.9,
        None,
        1,
    )
    assert outcomes[0] == "taken over" and len(outcomes) == 2
    assert outcomes[1].startswith(f"grading {grading_id} is already running (claimed at ")
    assert outcomes[1].endswith("; not running it twice")


def test_the_worker_skips_a_grading_another_runner_holds_and_the_cli_says_so(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand_ins: None
) -> None:
    """A grading claimed by another runner after the worker listed it is theirs: the worker
    neither runs it nor counts a failed try; `baseline grading run-queue` exits 1 naming it."""
    grading_id = _queued_script_grading(ctx, tmp_path)
    queued = orchestration._queued

    def claimed_meanwhile(ctx_: Context, model: Any, attempt_id: int | None) -> list[Any]:
        listed = queued(ctx_, model, attempt_id)
        if model is Grading and listed:  # another runner claims it now
            claims.claim(ctx, Grading, grading_id)
        return listed

    monkeypatch.setattr(orchestration, "_queued", claimed_meanwhile)
    monkeypatch.setattr(orchestration, "discover", lambda *_args: None)
    monkeypatch.setattr(scoring_cli, "_context", lambda: ctx)
    result = CliRunner().invoke(cli, ["grading", "run-queue"])
    assert result.exit_code == 1, result.output
    assert f"grading {grading_id} is already running (claimed at " in result.output
    row = _grading(ctx, grading_id)
    assert (row.status, row.tries, row.error) == (JobStatus.RUNNING, 0, None)


def test_a_running_script_grading_beats_a_heartbeat_under_its_claim(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand_ins: None
) -> None:
    """While the script runs (for up to its time limit) the row is marked alive, so that
    recovery never takes over a grading whose runner still works."""
    grading_id = _queued_script_grading(ctx, tmp_path)
    beats: list[bool] = []

    def score(*_args: object, **_kwargs: object) -> ScoringResult:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = _grading(ctx, grading_id)
            assert row.started_at is not None and row.heartbeat_at is not None
            if row.heartbeat_at > row.started_at:
                beats.append(True)
                break
            time.sleep(0.01)
        return _scored(0.5)

    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.02)
    monkeypatch.setattr(script_scoring, "score_in_workspace", score)
    done = script_scoring.run_script_grading(ctx, grading_id)
    assert beats == [True] and done.status is JobStatus.SUCCEEDED


def test_a_crash_inside_a_script_grading_is_a_failed_try_not_a_grading_running_for_good(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand_ins: None
) -> None:
    """An unexpected error inside the scoring (a bug, a lost connection) went up to the worker,
    which counts failed tries of queued rows only: the grading stayed running. Now it is a
    failed try of Baseline's own, tried again after its back-off."""
    grading_id = _queued_script_grading(ctx, tmp_path)

    def crash(*_args: object, **_kwargs: object) -> ScoringResult:
        raise RuntimeError("the connection to the engine was reset")

    monkeypatch.setattr(script_scoring, "score_in_workspace", crash)
    orchestration.process_queue(ctx)
    row = _grading(ctx, grading_id)
    assert (row.status, row.tries, row.started_at) == (JobStatus.QUEUED, 1, None)
    assert row.error == (
        "try 1 of 3 failed (RuntimeError: the connection to the engine was reset); retrying"
    )


def test_the_scheduler_recovers_a_stale_grading_at_its_start_and_every_minute_after(
    ctx: Context, tmp_path: Path, stand_ins: None
) -> None:
    """A grading left running by a portal that was killed: the next portal's scheduler queues
    it again as it starts, and keeps a job that does so every minute."""
    from baseline.jobs.scheduler import start_scheduler

    grading_id = _queued_script_grading(ctx, tmp_path)
    long_ago = utcnow() - timedelta(seconds=claims.STALE_AFTER_S + 60)
    with ctx.session() as session:
        row = session.get(Grading, grading_id)
        assert row is not None
        row.status, row.started_at, row.heartbeat_at = JobStatus.RUNNING, long_ago, long_ago
    runner = start_scheduler(ctx)
    try:
        jobs = {job.id for job in runner.scheduler.get_jobs()}
    finally:
        runner.shutdown()
    assert "recover-gradings" in jobs
    recovered = _grading(ctx, grading_id)
    assert (recovered.status, recovered.tries) == (JobStatus.QUEUED, 1)


def test_workspace_reconcile_recovers_a_stale_grading_and_removes_its_workspace(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand_ins: None
) -> None:
    """`baseline workspace reconcile` (what an operator runs after a crash) takes over a stale
    grading beside the reproductions: its scoring workspace removed, the grading queued."""
    grading_id = _queued_script_grading(ctx, tmp_path)
    destroyed = _killed_while_scoring(ctx, grading_id, monkeypatch)
    long_ago = utcnow() - timedelta(seconds=claims.STALE_AFTER_S + 60)
    with ctx.session() as session:
        row = session.get(Grading, grading_id)
        assert row is not None
        row.heartbeat_at = long_ago
    monkeypatch.setattr(Context, "from_settings", classmethod(lambda _cls: ctx))
    result = CliRunner().invoke(cli, ["workspace", "reconcile", "--no-restart"])
    assert result.exit_code == 0, result.output
    assert f"grading {grading_id}: its process stopped; queued again" in result.output
    assert destroyed == [WORKSPACE]
    assert _grading(ctx, grading_id).status is JobStatus.QUEUED


def test_an_experts_grading_in_progress_is_no_interrupted_run(
    ctx: Context, tmp_path: Path, stand_ins: None
) -> None:
    """An expert's grading stays running while they grade leaf by leaf, with no runner and no
    heartbeat: recovery leaves it as it is (requeued, a person's partial grades would be taken
    for a failed job's)."""
    grading_id = _queued_script_grading(ctx, tmp_path)
    long_ago = utcnow() - timedelta(seconds=claims.STALE_AFTER_S + 60)
    with ctx.session() as session:
        script = session.get(Grading, grading_id)
        assert script is not None
        expert = Grading(
            snapshot_id=script.snapshot_id, kind=GradingKind.EXPERT, status=JobStatus.RUNNING,
            config={"expert": True}, leaves_total=5, leaves_graded=2,
        )  # fmt: skip
        session.add(expert)
        session.flush()
        expert_id = expert.id
        script.status, script.started_at, script.heartbeat_at = (
            JobStatus.RUNNING, long_ago, long_ago
        )  # fmt: skip
    later = utcnow()
    assert grading_recovery.recover_interrupted(ctx, now=later) == [grading_id]
    still = _grading(ctx, expert_id)
    assert (still.status, still.tries, still.leaves_graded) == (JobStatus.RUNNING, 0, 2)


class _CommandBackend:
    """Stands for a scoring workspace's backend: `exec` runs a command that goes on until the
    workspace is stopped (or `longest_s` passes: then it ends as if it had finished)."""

    def __init__(self, longest_s: float = 5.0, on_start: Callable[[], object] = object) -> None:
        self.longest_s = longest_s
        self.on_start = on_start  # what happens elsewhere once the first command runs
        self.stopped = threading.Event()
        self.stopped_by: list[str] = []
        self.commands: list[str] = []

    def exec(self, _handle: object, command: list[str], **_kwargs: object) -> None:
        self.commands.append(" ".join(command))
        if len(self.commands) == 1:
            self.on_start()
        self.stopped.wait(self.longest_s)

    def stop(self, _handle: object) -> None:
        self.stopped_by.append(threading.current_thread().name)
        self.stopped.set()


def _workspace_with(backend: _CommandBackend) -> Any:
    """A stand-in for placing a scoring workspace whose backend is `backend`."""

    @contextmanager
    def placed(ctx: Context, **_kwargs: object) -> Iterator[reproductions.Placed]:
        yield reproductions.Placed(0, backend, SimpleNamespace(name=WORKSPACE))  # type: ignore[arg-type]

    return placed


def _scoring_runs_a_command(backend: _CommandBackend) -> Any:
    def score(workspace: Any, handle: Any, *_args: object) -> ScoringResult:
        workspace.exec(handle, ["python", "score.py"])
        workspace.exec(handle, ["cat", "score.json"])  # what follows the script
        return _scored(0.5)

    return score


def test_a_script_runner_that_cannot_record_its_heartbeat_stops_its_scoring_before_recovery(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database stays locked for the heartbeat: the runner went on scoring past the stale
    time, recovery queued the grading again and a second scoring workspace ran beside the first.
    Now, silent for `GIVE_UP_AFTER_S` (half the stale time), the runner stops its scoring
    workspace's command from the heartbeat's thread and gives the run up, the row left to
    recovery, which takes it over and queues it again."""
    grading_id = _queued_script_grading(ctx, tmp_path)
    backend = _CommandBackend()

    def locked(_heartbeat: object) -> bool:
        if not backend.commands:  # recorded until the command runs, however slow the start
            return True
        raise OperationalError("UPDATE gradings", {}, Exception("database is locked"))

    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.01)
    monkeypatch.setattr(claims, "GIVE_UP_AFTER_S", 0.2, raising=False)
    monkeypatch.setattr(claims.Heartbeat, "_record", locked, raising=False)
    monkeypatch.setattr(script_scoring, "disposable_workspace", _workspace_with(backend))
    monkeypatch.setattr(script_scoring, "score_in_workspace", _scoring_runs_a_command(backend))
    started = time.monotonic()
    with pytest.raises(Conflict, match=r"no heartbeat recorded for .* s; run given up"):
        script_scoring.run_script_grading(ctx, grading_id)
    assert time.monotonic() - started < backend.longest_s  # stopped, not run to its end
    assert backend.commands == ["python score.py"]  # nothing more ran in the workspace
    assert backend.stopped_by == [f"grading-{grading_id}-heartbeat"]
    left = _grading(ctx, grading_id)
    assert (left.status, left.tries, left.score, left.error) == (JobStatus.RUNNING, 0, None, None)
    later = utcnow() + timedelta(seconds=claims.STALE_AFTER_S + 1)
    monkeypatch.setattr(claims, "destroy", lambda *_args: None)
    assert grading_recovery.recover_interrupted(ctx, now=later) == [grading_id]
    assert (_grading(ctx, grading_id).status, _grading(ctx, grading_id).tries) == (
        JobStatus.QUEUED,
        1,
    )


def test_a_script_runner_whose_claim_was_taken_over_stops_its_scoring(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery took the grading over while its runner, silent but alive, still scored: the
    runner saw it at its next heartbeat and stopped beating, but its scoring ran on to its end
    (the GPUs held beside the next run's) for a result the claim then refused. Now it stops the
    command and says so."""
    grading_id = _queued_script_grading(ctx, tmp_path)

    def take_over() -> None:  # while the scoring command runs
        later = utcnow() + timedelta(seconds=claims.STALE_AFTER_S + 1)
        assert grading_recovery.recover_interrupted(ctx, now=later) == [grading_id]

    backend = _CommandBackend(on_start=take_over)
    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.01)
    monkeypatch.setattr(claims, "destroy", lambda *_args: None)
    monkeypatch.setattr(script_scoring, "disposable_workspace", _workspace_with(backend))
    monkeypatch.setattr(script_scoring, "score_in_workspace", _scoring_runs_a_command(backend))
    started = time.monotonic()
    with pytest.raises(Conflict, match="claim was taken over; run given up"):
        script_scoring.run_script_grading(ctx, grading_id)
    assert time.monotonic() - started < backend.longest_s
    assert backend.commands == ["python score.py"]
    assert backend.stopped_by == [f"grading-{grading_id}-heartbeat"]
    requeued = _grading(ctx, grading_id)
    assert (requeued.status, requeued.tries, requeued.score) == (JobStatus.QUEUED, 1, None)
