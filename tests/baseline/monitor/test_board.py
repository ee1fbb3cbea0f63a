"""The monitor's board: what it says about attempts, hosts, the queue and spend, from real rows."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from baseline.attempts import attempts
from baseline.context import Context
from baseline.models import (
    Attempt,
    GpuAssignment,
    Grading,
    GradingKind,
    Host,
    JobStatus,
    ModelCall,
    Pause,
    PauseReason,
    Reproduction,
    Snapshot,
    Study,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.monitor import board, settings
from tests.baseline.attempt_world import directory_resolver, make_attempt


def _study(ctx: Context, attempt_id: int) -> int:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        return attempt.study_id


def test_board_shows_clock_pauses_snapshot_grade_and_cost(ctx: Context, tmp_path: Path) -> None:
    attempt_id = make_attempt(ctx, checkpoints=(1,), time_scale=60.0)
    start = utcnow() - timedelta(minutes=2)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path), now=start)
    attempts.pause(
        ctx, attempt_id, PauseReason.ADMIN, None, "lunch", now=start + timedelta(seconds=30)
    )
    attempts.resume(ctx, attempt_id, None, now=start + timedelta(seconds=60))
    study_id = _study(ctx, attempt_id)
    with ctx.session() as session:
        snap = session.query(Snapshot).filter_by(attempt_id=attempt_id).one()  # the start one
        session.add(
            Grading(
                snapshot_id=snap.id, kind=GradingKind.JUDGE, status=JobStatus.SUCCEEDED, score=0.4
            )
        )
        session.flush()
        session.add_all(
            [
                ModelCall(
                    study_id=study_id, attempt_id=attempt_id, purpose="agent", model="m",
                    cost_usd=cost, created_at=start + timedelta(seconds=10),
                )
                for cost in (1.5, 0.5)
            ]
        )  # fmt: skip
        study = session.get(Study, study_id)
        assert study is not None
        settings.save(session, study, settings.MonitorConfig(budget_usd=4.0), None)
    now = start + timedelta(seconds=120)
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        found = board.study_board(session, study, now)
    [row] = found.attempts
    assert row.clock == "running" and row.status == "running"
    assert row.working_s == 90 * 60.0  # 120 s wall, 30 s paused, 60 working s per wall s
    assert [(p.reason, p.note) for p in row.pauses] == [("admin", "lunch")]
    assert row.last_activity_at == start + timedelta(seconds=60)  # the resume
    assert row.idle_working_s == 60 * 60.0
    assert row.last_snapshot is not None and row.last_snapshot.kind == "start"
    assert row.last_grade is not None and row.last_grade.score == 0.4
    assert row.cost_usd == 2.0
    # the 1 h checkpoint was passed at 90 working minutes and is not taken
    assert [m.due_working_s for m in row.missing_checkpoints] == [3600.0]
    assert found.spend.agent_usd == 2.0 and found.spend.share == 0.5


def test_board_counts_hosts_queue_and_judge_spend(ctx: Context, tmp_path: Path) -> None:
    attempt_id = make_attempt(ctx)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path))
    study_id = _study(ctx, attempt_id)
    old = utcnow() - timedelta(minutes=90)
    with ctx.session() as session:
        host = Host(
            name="gpu-1", docker_url="ssh://x@gpu-1", healthy=True,
            gpus=[{"index": 0}, {"index": 1}, {"index": 2}],
        )  # fmt: skip
        session.add(host)
        session.flush()
        ws = Workspace(
            attempt_id=attempt_id, purpose=WorkspacePurpose.ATTEMPT, host_id=host.id,
            backend="docker", name="ws-1", image="img", hardware_profile="h100",
            status=WorkspaceStatus.RUNNING,
        )  # fmt: skip
        session.add(ws)
        session.flush()
        session.add(GpuAssignment(host_id=host.id, device_index=0, workspace_id=ws.id))
        snap = session.query(Snapshot).filter_by(attempt_id=attempt_id).one()
        session.add(Reproduction(snapshot_id=snap.id, status=JobStatus.QUEUED))
        grading = Grading(
            snapshot_id=snap.id, kind=GradingKind.JUDGE, status=JobStatus.QUEUED, created_at=old
        )
        failed = Grading(
            snapshot_id=snap.id, kind=GradingKind.SCRIPT, status=JobStatus.SUCCEEDED,
            error="no_score: scoring crashed", finished_at=utcnow(),
        )  # fmt: skip
        session.add_all([grading, failed])
        session.flush()
        session.add(
            ModelCall(
                study_id=study_id, attempt_id=attempt_id, grading_id=grading.id,
                purpose="judge_grade", model="j", cost_usd=0.25,
            )
        )  # fmt: skip
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        found = board.study_board(session, study)
    [host_view] = [h for h in found.hosts if h.name == "gpu-1"]
    assert (host_view.gpus_total, host_view.gpus_free, host_view.running_workspaces) == (3, 2, 1)
    assert found.attempts[0].host == "gpu-1" and found.attempts[0].workspace_status == "running"
    q = found.queue
    assert (q.reproductions_queued, q.gradings_queued) == (1, 1)
    assert q.oldest_queued_at == old and q.oldest_age_s is not None and q.oldest_age_s >= 5400
    assert (q.recent_gradings, q.failed_gradings) == (1, 1)
    assert found.spend.judge_usd == 0.25 and found.spend.agent_usd == 0.0
    assert found.spend.budget_usd is None and found.spend.share is None


def test_the_version_changes_with_a_change_and_with_the_time_bucket(
    ctx: Context, tmp_path: Path
) -> None:
    attempt_id = make_attempt(ctx)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path))
    study_id = _study(ctx, attempt_id)
    at = utcnow().replace(second=1, microsecond=0)  # the start of a 30 s bucket
    with ctx.session() as session:
        first = board.version(session, study_id, at)
        assert board.version(session, study_id, at + timedelta(seconds=20)) == first
        assert board.version(session, study_id, at + timedelta(seconds=35)) != first
    attempts.pause(ctx, attempt_id, PauseReason.ADMIN, None, "check")
    with ctx.session() as session:
        paused = board.version(session, study_id, at)
        assert paused != first
    attempts.resume(ctx, attempt_id, None)
    with ctx.session() as session:
        assert board.version(session, study_id, at) not in (first, paused)
        session.add(ModelCall(study_id=study_id, attempt_id=attempt_id, purpose="agent", model="m"))
        session.flush()
        assert board.version(session, study_id, at) != paused


def test_an_attempt_waiting_for_its_workspace_is_not_started_not_ended(ctx: Context) -> None:
    attempt_id = make_attempt(ctx)  # pending: created, never launched
    with ctx.session() as session:
        study = session.get(Study, _study(ctx, attempt_id))
        assert study is not None
        [row] = board.study_board(session, study).attempts
    assert (row.status, row.clock, row.working_s, row.missing_checkpoints) == (
        "pending",
        "not started",
        0.0,
        [],
    )


def test_an_attempt_waiting_for_its_first_login_is_not_started_not_paused(
    ctx: Context, tmp_path: Path
) -> None:
    """A launched human attempt's clock waits for the first login behind a not_started pause:
    the participant's own bar says "not started", and the board said "paused" (counted on the
    monitor's Paused card, and missed by its "not started" filter)."""
    attempt_id = make_attempt(ctx)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path))
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.started_at is not None
        session.add(
            Pause(attempt_id=attempt_id, started_at=attempt.started_at,
                  reason=PauseReason.NOT_STARTED, note="waiting for the first login")
        )  # fmt: skip
    with ctx.session() as session:
        study = session.get(Study, _study(ctx, attempt_id))
        assert study is not None
        [row] = board.study_board(session, study).attempts
    assert (row.clock, row.pause_reason) == ("not started", "not_started")
    with ctx.session() as session:  # the first login ends the wait
        waiting = session.scalars(select(Pause).where(Pause.attempt_id == attempt_id)).one()
        waiting.ended_at = utcnow()
    attempts.pause(ctx, attempt_id, PauseReason.ADMIN, None, "check")  # a pause someone took
    with ctx.session() as session:
        [row] = board.study_board(session, study).attempts
    assert (row.clock, row.pause_reason) == ("paused", "admin")
