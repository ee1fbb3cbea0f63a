"""An intermediate score whose process died mid-scoring is recovered: its row says it was
interrupted (no score), its attempt's scoring pause ends and its scoring workspace is destroyed.

Before, its row was written only at its end: a portal killed while it scored left the attempt
paused with reason scoring for good (the participant's clock frozen), the scoring workspace
standing (the sweep left unnamed scoring workspaces alone) and no trace of the score asked.

SQLite-only and without Docker: the scoring workspace is placed on `FakeEngine`, and the scoring
script is a stand-in."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select

from baseline.attempts import attempts, clock
from baseline.attempts.snapshots import DirectorySource
from baseline.context import Context
from baseline.grading import claims, grading_recovery, reproductions, script_scoring
from baseline.models import (
    Attempt,
    AttemptStatus,
    Host,
    JobStatus,
    Pause,
    PauseReason,
    Role,
    ScoreLog,
    Task,
    TaskKind,
    Workspace,
    WorkspaceStatus,
    utcnow,
)
from baseline.people import accounts
from baseline.tasks.tasks import demo_reference_submission
from infra.workspace import WorkspaceError, WorkspaceHandle
from scoring.scoring_run import ScoringResult
from tests.baseline.fake_engine import FakeEngine, destroyed
from tests.conftest import Users, login
from tests.scoring.scoring_world import build_world

pytestmark = pytest.mark.sqlite_only("an intermediate score's rows, on a fake engine")

LATER = timedelta(seconds=claims.STALE_AFTER_S + 1)


class _Killed(BaseException):
    """The portal's process dies mid-scoring: nothing after this line of it runs."""


@dataclass
class Live:
    """A running attempt of the demo's scored task, on a host of `engine`."""

    attempt_id: int
    engine: FakeEngine
    submission: Path

    def score(self, ctx: Context) -> ScoreLog:
        return script_scoring.intermediate_score(
            ctx,
            self.attempt_id,
            None,
            backend_factory=self.engine.factory,
            resolver=lambda _session, _attempt: DirectorySource(str(self.submission)),
        )


@pytest.fixture
def live(ctx: Context, tmp_path: Path) -> Live:
    world = build_world(ctx, image_digest="sha256:" + "a" * 64)
    with ctx.session() as session:
        scored = session.scalars(select(Task).where(Task.kind == TaskKind.SCORED)).first()
        attempt = session.get(Attempt, world.attempt_id)
        assert scored is not None and attempt is not None
        attempt.task_id, attempt.status = scored.id, AttemptStatus.RUNNING
        attempt.started_at = utcnow() - timedelta(hours=1)
        session.add(Host(name="engine", docker_url="unix:///run/engine.sock", healthy=True))
    submission = tmp_path / "submission"
    shutil.copytree(demo_reference_submission(), submission)
    return Live(world.attempt_id, FakeEngine(), submission)


def _scoring(result: ScoringResult, meanwhile: Callable[[], None] = lambda: None) -> Any:
    def score(*_args: object, **_kwargs: object) -> ScoringResult:
        meanwhile()
        return result

    return score


def _die(*_args: object, **_kwargs: object) -> ScoringResult:
    raise _Killed


def _killed_while_scoring(ctx: Context, live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ask for the score and kill the process while the script runs: nothing it would have done
    afterwards (resume the clock, destroy the workspace) is done."""
    with monkeypatch.context() as dying:
        dying.setattr(script_scoring, "score_in_workspace", _die)
        dying.setattr(reproductions, "destroy_or_leave", lambda *_args: None)
        dying.setattr(attempts, "resume", lambda *_args, **_kwargs: None)
        dying.setattr(attempts, "resume_if", lambda *_args: False, raising=False)
        with pytest.raises(_Killed):
            live.score(ctx)


def _open_pause(ctx: Context, attempt_id: int) -> PauseReason | None:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        pause = clock.open_pause(attempt)
        return None if pause is None else pause.reason


def _scoring_workspaces(ctx: Context) -> list[tuple[str, WorkspaceStatus]]:
    with ctx.session() as session:
        return [(w.name, w.status) for w in session.scalars(select(Workspace))]


def _logs(ctx: Context, attempt_id: int) -> list[ScoreLog]:
    with ctx.session() as session:
        return script_scoring.score_logs(session, attempt_id)


def test_an_intermediate_score_whose_process_died_is_closed_and_its_clock_runs_again(
    ctx: Context, live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed while the script ran: the attempt stayed paused (scoring) with its workspace
    standing. Once silent past the stale time, recovery closes the score as interrupted (no
    score, never 0), ends the scoring pause and destroys the workspace."""
    _killed_while_scoring(ctx, live, monkeypatch)
    assert _open_pause(ctx, live.attempt_id) is PauseReason.SCORING
    ((name, status),) = _scoring_workspaces(ctx)
    assert status is WorkspaceStatus.RUNNING
    (dead,) = _logs(ctx, live.attempt_id)
    assert (dead.status, dead.workspace, dead.normalised_score) == (JobStatus.RUNNING, name, None)
    assert grading_recovery.recover_intermediate_scores(ctx) == []  # not silent long enough

    now = utcnow() + LATER
    recovered = grading_recovery.recover_intermediate_scores(
        ctx, backend_factory=live.engine.factory, now=now
    )
    assert recovered == [dead.id]
    (closed,) = _logs(ctx, live.attempt_id)
    assert (closed.status, closed.raw_score, closed.normalised_score, closed.floor_reason) == (
        JobStatus.FAILED,
        None,
        None,
        None,
    )
    assert (closed.error or "").startswith("interrupted: its process stopped (no sign of life")
    assert _open_pause(ctx, live.attempt_id) is None
    with ctx.session() as session:
        attempt = session.get(Attempt, live.attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.RUNNING
    assert _scoring_workspaces(ctx) == [(name, WorkspaceStatus.DESTROYED)]
    assert live.engine.calls[-2:] == destroyed(name)
    # Done once: the next round finds nothing more to do.
    assert grading_recovery.recover_intermediate_scores(ctx, now=now) == []

    # The participant asks again, and is scored.
    monkeypatch.setattr(script_scoring, "score_in_workspace", _scoring(_result(0.75)))
    again = live.score(ctx)
    assert (again.status, again.normalised_score, again.error) == (JobStatus.SUCCEEDED, 0.75, None)


def _result(raw: float) -> ScoringResult:
    return ScoringResult(raw_score=raw, normalised_score=raw, exit_code=0)


def test_a_live_intermediate_score_beats_a_heartbeat_and_is_left_alone(
    ctx: Context, live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the script runs (up to its time limit) the row is running, names its workspace and
    is marked alive; recovery (and the sweep) leave it, its pause and its workspace alone."""
    seen: list[tuple[Any, ...]] = []

    def while_scoring() -> None:
        (row,) = _logs(ctx, live.attempt_id)
        first = row.heartbeat_at
        assert first is not None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            (row,) = _logs(ctx, live.attempt_id)
            assert row.heartbeat_at is not None
            if row.heartbeat_at > first:
                break
            time.sleep(0.01)
        assert grading_recovery.recover_intermediate_scores(ctx) == []
        with ctx.session() as session:
            assert claims.sweep_disposable(session, live.engine.factory, utcnow() + LATER) == []
        (row,) = _logs(ctx, live.attempt_id)
        assert row.heartbeat_at is not None
        seen.append((row.status, row.heartbeat_at > first, row.workspace))
        seen.append((_open_pause(ctx, live.attempt_id), _scoring_workspaces(ctx)))

    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.02)
    monkeypatch.setattr(script_scoring, "score_in_workspace", _scoring(_result(0.5), while_scoring))
    entry = live.score(ctx)
    ((name, _),) = _scoring_workspaces(ctx)
    assert seen == [
        (JobStatus.RUNNING, True, name),
        (PauseReason.SCORING, [(name, WorkspaceStatus.RUNNING)]),
    ]
    assert (entry.status, entry.normalised_score, entry.workspace) == (
        JobStatus.SUCCEEDED,
        0.5,
        name,
    )
    assert _open_pause(ctx, live.attempt_id) is None
    assert _scoring_workspaces(ctx) == [(name, WorkspaceStatus.DESTROYED)]


class _Unanswering(FakeEngine):
    """Its host is down: every destroy fails."""

    def destroy(self, handle: WorkspaceHandle, *, keep_submission: bool = False) -> None:
        raise WorkspaceError("the engine does not answer")


def test_a_workspace_that_cannot_be_removed_now_does_not_keep_the_clock_paused(
    ctx: Context, live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scoring workspace's host is down when recovery runs: the score is closed and the
    clock runs again all the same; the row still names the workspace, which the sweep destroys
    once the host answers."""
    _killed_while_scoring(ctx, live, monkeypatch)
    ((name, _),) = _scoring_workspaces(ctx)
    later = utcnow() + LATER
    down = _Unanswering().factory
    (dead,) = _logs(ctx, live.attempt_id)
    assert grading_recovery.recover_intermediate_scores(ctx, backend_factory=down, now=later) == [
        dead.id
    ]
    assert _open_pause(ctx, live.attempt_id) is None
    assert _scoring_workspaces(ctx) == [(name, WorkspaceStatus.RUNNING)]
    with ctx.session() as session:
        assert claims.sweep_disposable(session, down, later) == []
        assert claims.sweep_disposable(session, live.engine.factory, later) == [name]
    assert _scoring_workspaces(ctx) == [(name, WorkspaceStatus.DESTROYED)]


def test_recovery_ends_a_scoring_pause_only(
    ctx: Context, live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A score asked inside a coordinator's pause is scored in that pause: when its process
    dies, recovery closes the score and leaves the coordinator's pause open."""
    attempts.pause(ctx, live.attempt_id, PauseReason.ADMIN, None, note="a coordinator's pause")
    _killed_while_scoring(ctx, live, monkeypatch)
    later = utcnow() + LATER
    (dead,) = _logs(ctx, live.attempt_id)
    recovered = grading_recovery.recover_intermediate_scores(
        ctx, backend_factory=live.engine.factory, now=later
    )
    assert recovered == [dead.id]
    assert _open_pause(ctx, live.attempt_id) is PauseReason.ADMIN


def test_a_taken_over_score_leaves_a_pause_opened_since_alone(
    ctx: Context, live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner silent past the stale time but alive: recovery closed its score and ended its
    pause, and a coordinator paused the attempt since. The runner's own resume ended whatever
    pause was open (the coordinator's); it now ends its own only, and writes nothing over what
    recovery wrote."""

    def taken_over_then_paused() -> None:
        recovered = grading_recovery.recover_intermediate_scores(
            ctx, backend_factory=live.engine.factory, now=utcnow() + LATER
        )
        assert len(recovered) == 1
        attempts.pause(ctx, live.attempt_id, PauseReason.ADMIN, None, note="after the recovery")

    monkeypatch.setattr(
        script_scoring, "score_in_workspace", _scoring(_result(0.5), taken_over_then_paused)
    )
    entry = live.score(ctx)
    assert _open_pause(ctx, live.attempt_id) is PauseReason.ADMIN
    assert (entry.status, entry.normalised_score) == (JobStatus.FAILED, None)
    assert (entry.error or "").startswith("interrupted: its process stopped")


def test_the_scheduler_job_ends_a_scoring_pause_no_running_score_holds(
    ctx: Context, live: Live
) -> None:
    """The gradings' recovery job (the scheduler's, every minute) closes a stale intermediate
    score, and ends a scoring pause that no running score holds: one a process of an older
    Baseline left, which wrote no row while it scored. A fresh scoring pause is left alone."""
    long_ago = utcnow() - LATER - LATER
    with ctx.session() as session:
        attempt = session.get(Attempt, live.attempt_id)
        assert attempt is not None
        clock.start_pause(session, attempt, PauseReason.SCORING, None, at=long_ago)
        other = Attempt(
            study_id=attempt.study_id, participant_id=attempt.participant_id,
            task_id=attempt.task_id, hardware_profile="cpu", working_time_limit_s=3600.0,
            status=AttemptStatus.RUNNING, started_at=long_ago,
        )  # fmt: skip
        session.add(other)
        session.flush()
        clock.start_pause(session, other, PauseReason.SCORING, None)  # just opened
        stale = ScoreLog(
            attempt_id=other.id, working_s=60.0, status=JobStatus.RUNNING,
            created_at=long_ago, heartbeat_at=long_ago,
        )  # fmt: skip
        session.add(stale)
        session.flush()
        ids = (other.id, stale.id)
    assert grading_recovery.recover_job(ctx) == []  # gradings: none
    assert _open_pause(ctx, live.attempt_id) is None
    with ctx.session() as session:
        row = session.get(ScoreLog, ids[1])
        assert row is not None and row.status is JobStatus.FAILED
        pauses = session.scalars(select(Pause).where(Pause.attempt_id == live.attempt_id))
        assert [p.ended_at is not None for p in pauses] == [True]
    assert _open_pause(ctx, ids[0]) is PauseReason.SCORING  # opened just now: not yet


def test_a_running_score_is_shown_as_being_scored_never_as_a_score_or_an_error(
    ctx: Context, live: Live, app: Flask, users: Users
) -> None:
    """The attempt's scores page, the scores API and the analysis table: a running intermediate
    score is neither 0 nor an error; an interrupted one is missing with its error."""
    from analysis import load_study

    interrupted = "interrupted: its process stopped (no sign of life for 130 s); no score"
    with ctx.session() as session:
        session.add_all(
            [
                ScoreLog(
                    attempt_id=live.attempt_id, working_s=600.0, status=JobStatus.RUNNING,
                    heartbeat_at=utcnow(),
                ),
                ScoreLog(
                    attempt_id=live.attempt_id, working_s=300.0, status=JobStatus.FAILED,
                    error=interrupted,
                ),
            ]
        )  # fmt: skip
        attempt = session.get(Attempt, live.attempt_id)
        assert attempt is not None
        study_id = attempt.study_id
        coordinator = session.merge(users[Role.COORDINATOR])
        token = accounts.issue_token(session, coordinator, "scores-test")

    client = app.test_client()
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/grading/attempt/{live.attempt_id}").get_data(as_text=True)
    assert "being scored…" in page and interrupted in page
    scores = client.get(
        f"/api/v1/attempts/{live.attempt_id}/scores", headers={"Authorization": f"Bearer {token}"}
    )
    assert scores.status_code == 200, scores.get_data(as_text=True)
    body = scores.get_json()
    assert body is not None
    shown = [(s["status"], s["normalised_score"], s["error"]) for s in body["intermediate"]]
    assert shown == [("failed", None, interrupted), ("running", None, None)]
    table = load_study(study_id, context=ctx).table
    logged = table[table["source"] == "score_log"].sort_values("working_hours")
    assert logged["missing"].tolist() == ["score_error", "not_graded"]
    assert logged["score"].isna().all()
