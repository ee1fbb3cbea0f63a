"""The tidy table built from the database: every row accounted for, missing data named."""

from __future__ import annotations

import math
from datetime import timedelta

import pandas as pd
import pytest
from sqlalchemy import select, update

from analysis import load_study
from analysis.seed import seed_synthetic_study
from analysis.table import COLUMNS, sub_scores
from baseline.context import Context
from baseline.grading.reproductions import reproduction_status
from baseline.models import (
    Attempt,
    AttemptStatus,
    AuditEvent,
    Grading,
    JobStatus,
    ModelCall,
    Participant,
    ParticipantKind,
    Pause,
    PauseReason,
    Reproduction,
    Snapshot,
    SnapshotKind,
    Study,
    StudyStatus,
    Task,
)
from tests.conftest import SeededStudy

# Seeded once per run; each test that uses the fixture below starts on a copy.
SEEDED_STUDY = SeededStudy("table test", seed=1, fixture="study")


@pytest.fixture
def study(ctx: Context) -> Study:
    with ctx.session() as session:
        return seed_synthetic_study(session, name="table test", seed=1)


def test_seeding_is_idempotent_by_name(ctx: Context, study: Study) -> None:
    with ctx.session() as session:
        again = seed_synthetic_study(session, name="table test", seed=99)
        assert again.id == study.id
        assert session.scalar(select(Study).where(Study.name == "table test")) is not None
        n = len(session.scalars(select(Attempt).where(Attempt.study_id == study.id)).all())
    assert n == 5 * (3 + 4 + 4)  # 5 tasks; 3 humans and two agents with 4 runs each


def test_the_seeded_study_is_closed_with_every_attempt_ended(ctx: Context, study: Study) -> None:
    """Seeded as a draft, it read "being set up: no attempt has started yet" above 55 ended
    attempts; it is a finished study, closed, and its audit log says so."""
    with ctx.session() as session:
        seeded = session.get(Study, study.id)
        assert seeded is not None and seeded.status is StudyStatus.CLOSED
        closed = session.scalars(
            select(AuditEvent.details).where(
                AuditEvent.action == "study.status", AuditEvent.target_id == str(study.id)
            )
        ).all()
        assert closed == [{"was": "draft", "now": "closed"}]
        statuses = set(session.scalars(select(Attempt.status).where(Attempt.study_id == study.id)))
    assert statuses <= {AttemptStatus.ENDED, AttemptStatus.SUBMITTED, AttemptStatus.FAILED}


def test_seeded_agents_pause_for_their_provider_and_humans_for_breaks(
    ctx: Context, study: Study
) -> None:
    """Agents' clocks read "participant: break (synthetic)" as humans' did."""
    with ctx.session() as session:
        rows = session.execute(
            select(Participant.kind, Pause.reason)
            .join(Attempt, Attempt.participant_id == Participant.id)
            .join(Pause, Pause.attempt_id == Attempt.id)
            .where(Attempt.study_id == study.id)
        )
        reasons = {(kind, reason) for kind, reason in rows}
    assert reasons == {
        (ParticipantKind.HUMAN, PauseReason.PARTICIPANT),
        (ParticipantKind.AGENT, PauseReason.RATE_LIMIT),
    }


def test_every_seeded_attempt_starts_with_a_start_snapshot_at_the_floor(
    ctx: Context, study: Study
) -> None:
    """As a real attempt does: the attempt page read "start: not taken" on every seeded one."""
    with ctx.session() as session:
        attempts = session.scalars(select(Attempt).where(Attempt.study_id == study.id)).all()
        starts = [s for a in attempts for s in a.snapshots if s.kind is SnapshotKind.START]
        assert len(starts) == len(attempts) and {s.attempt_id for s in starts} == {
            a.id for a in attempts
        }
        assert {(s.due_working_s, s.taken_working_s) for s in starts} == {(0.0, 0.0)}
        assert all(s.taken_at == s.attempt.started_at for s in starts)
    rows = load_study(study.id, context=ctx).table
    start = rows[rows["snapshot_kind"] == "start"]
    assert len(start) == len(attempts) and (start["checkpoint_hours"] == 0.0).all()
    assert (start["score"] == 0.0).all() and start["missing"].isna().all()
    paper = start[start["task_kind"] == "paper"]
    assert len(paper) > 0 and (paper["failure_class"] == "missing_reproduce_sh").all()
    scored = start[start["task_kind"] == "scored"]
    with ctx.session() as session:
        starting = {
            t.id: (t.scoring or {}).get("starting_score") for t in session.scalars(select(Task))
        }
    assert len(scored) > 0
    assert (scored["raw_score"] == scored["task_id"].map(starting)).all()


def test_table_has_one_row_per_measurement(ctx: Context, study: Study) -> None:
    data = load_study(study.name, context=ctx)
    table = data.table
    assert list(table.columns[: len(COLUMNS)]) == list(COLUMNS)
    assert data.synthetic and table["synthetic"].all()
    assert set(data.groups) == {"human", "iterative:model-a", "basic:model-b"}
    with ctx.session() as session:
        snaps = session.scalars(
            select(Snapshot).join(Attempt).where(Attempt.study_id == study.id)
        ).all()
    assert (table["source"] == "snapshot").sum() == len(snaps)
    assert (table["source"] == "score_log").sum() > 0
    assert data.checkpoints == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert {"cat:Code Development", "stage:design"} <= set(table.columns)


def test_missing_data_is_named_and_never_zero(ctx: Context, study: Study) -> None:
    table = load_study(study.id, context=ctx).table
    reasons = set(table["missing"].dropna())
    assert {"ended_early", "not_graded", "grading_incomplete", "grading_failed"} <= reasons
    ended = table[table["missing"] == "ended_early"]
    assert ended["score"].isna().all() and (ended["source"] == "expected").all()
    assert set(ended["attempt_status"]) <= {"failed", "submitted"}
    incomplete = table[table["missing"] == "grading_incomplete"]
    assert (incomplete["leaves_invalid"] > 0).all()
    failed = table[table["missing"] == "grading_failed"]
    assert failed["score"].isna().all()


def test_costs_follow_the_rate_and_the_ledger(ctx: Context, study: Study) -> None:
    data = load_study(study.name, context=ctx, hourly_rate=100.0)
    snaps = data.table[data.table["source"] == "snapshot"]
    humans = snaps[snaps["participant_kind"] == "human"]
    assert (humans["cost_usd"] == humans["working_hours"] * 100.0).all()
    agents = snaps[snaps["group"] == "iterative:model-a"]
    at8 = agents[agents["checkpoint_hours"] == 8.0]
    assert at8["api_cost_usd"].to_numpy() == pytest.approx(16 * 15.4 / 2)
    with ctx.session() as session:
        first = session.scalar(
            select(Attempt)
            .join(Participant)
            .where(Attempt.study_id == study.id, Participant.agent_model == "model-a")
        )
        assert first is not None
        total = sum(
            c.cost_usd
            for c in session.scalars(select(ModelCall).where(ModelCall.attempt_id == first.id))
        )
    last = data.table[(data.table["attempt_id"] == first.id) & (data.table["source"] == "snapshot")]
    assert last["api_cost_usd"].max() == pytest.approx(total)


def test_the_final_row_counts_the_call_that_crossed_the_limit(ctx: Context, study: Study) -> None:
    """A working-time limit falls due while a model call runs: the scheduler's final snapshot is
    taken before the call ends and is ledgered. That call was paid for the attempt, so the final
    row's cost holds it (an earlier checkpoint's row still holds only what came before it)."""
    with ctx.session() as session:
        agent = session.scalar(
            select(Attempt)
            .join(Participant)
            .where(Attempt.study_id == study.id, Participant.agent_model == "model-a")
        )
        assert agent is not None
        last = max(agent.snapshots, key=lambda s: s.taken_at)
        final = Snapshot(
            attempt_id=agent.id, kind=SnapshotKind.FINAL, due_working_s=last.taken_working_s,
            taken_working_s=last.taken_working_s, taken_at=last.taken_at + timedelta(seconds=1),
            manifest_sha256=last.manifest_sha256, file_count=0, total_bytes=0,
        )  # fmt: skip
        session.add(final)
        session.add(
            ModelCall(
                study_id=study.id, attempt_id=agent.id, purpose="agent", model="model-a",
                prompt_tokens=1, completion_tokens=1, cost_usd=2.5,
                created_at=final.taken_at + timedelta(seconds=3),
            )
        )  # fmt: skip
        session.flush()
        agent_id, final_id = agent.id, final.id
        total = sum(
            c.cost_usd
            for c in session.scalars(select(ModelCall).where(ModelCall.attempt_id == agent_id))
        )
    table = load_study(study.name, context=ctx).table
    row = table[table["snapshot_id"] == final_id]
    assert row["api_cost_usd"].to_numpy() == pytest.approx([total])
    earlier = table[(table["attempt_id"] == agent_id) & (table["snapshot_kind"] == "checkpoint")]
    assert earlier["api_cost_usd"].max() == pytest.approx(total - 2.5)


def test_reproduction_status_is_succeeded_only_when_reproduce_sh_ran_clean(
    ctx: Context, study: Study
) -> None:
    """A reproduction Baseline carried out is a SUCCEEDED job whatever the script did; the
    table named that "succeeded" even for a missing or failing reproduce.sh."""
    table = load_study(study.name, context=ctx).table
    ran = table[table["reproduction_status"].notna()]
    failed = ran[ran["reproduction_failed"]]
    assert len(failed) > 0 and len(ran) > len(failed)
    assert (failed["reproduction_status"] == failed["failure_class"]).all()
    assert (ran[~ran["reproduction_failed"]]["reproduction_status"] == "succeeded").all()
    with ctx.session() as session:
        snap = session.scalar(select(Snapshot).join(Attempt).where(Attempt.study_id == study.id))
        assert snap is not None
        missing = Reproduction(
            snapshot_id=snap.id, status=JobStatus.SUCCEEDED, exit_code=None,
            failure_class="missing_reproduce_sh",
        )  # fmt: skip
        nonzero = Reproduction(snapshot_id=snap.id, status=JobStatus.SUCCEEDED, exit_code=2)
        broken = Reproduction(snapshot_id=snap.id, status=JobStatus.FAILED, error="no room")
        clean = Reproduction(snapshot_id=snap.id, status=JobStatus.SUCCEEDED, exit_code=0)
    assert reproduction_status(missing) == "missing_reproduce_sh"
    assert reproduction_status(nonzero) == "script_error"
    assert reproduction_status(broken) == "failed"
    assert reproduction_status(clean) == "succeeded"


def test_agreement_pairs_judge_and_expert(ctx: Context, study: Study) -> None:
    agreement = load_study(study.name, context=ctx).agreement
    assert len(agreement) > 0
    assert (agreement["leaves_compared"] == 20).all()
    assert agreement["leaf_agreement"].between(0, 1).all()


def test_sub_scores_read_the_nested_sections_only() -> None:
    report = {"score": 0.5, "lower": 0.25, "leaves": 20, "categories": {"Code Development": 0.5}}
    assert sub_scores(report) == {"cat:Code Development": 0.5}
    nested = sub_scores({"category": {"Result Analysis": {"score": 0.25}}, "stages": {"design": 1}})
    assert nested == {"cat:Result Analysis": 0.25, "stage:design": 1.0}
    assert sub_scores({"category": {"Code Execution": math.nan}}) == {}
    assert sub_scores(None) == {}


def test_running_attempt_gets_no_ended_early_rows(ctx: Context, study: Study) -> None:
    with ctx.session() as session:
        attempt = session.scalar(
            select(Attempt).where(
                Attempt.study_id == study.id, Attempt.status == AttemptStatus.FAILED
            )
        )
        assert attempt is not None
        attempt.status = AttemptStatus.RUNNING
        attempt_id = attempt.id
    table = load_study(study.name, context=ctx).table
    rows = table[table["attempt_id"] == attempt_id]
    assert not (rows["source"] == "expected").any()


def test_grading_choice_prefers_latest_succeeded(ctx: Context, study: Study) -> None:
    from analysis.table import choose_grading
    from baseline.models import GradingKind, JobStatus

    with ctx.session() as session:
        gradings = session.scalars(select(Grading).limit(1)).all()
        snap_id = gradings[0].snapshot_id
        newer = Grading(snapshot_id=snap_id, kind=gradings[0].kind, status=JobStatus.RUNNING)
        session.add(newer)
        session.flush()
        chosen = choose_grading([*gradings, newer], gradings[0].kind)
        assert chosen is gradings[0]
        assert choose_grading([newer], GradingKind.EXPERT) is None


def test_a_failed_scoring_is_a_result_at_the_floor_and_a_baseline_failure_is_missing(
    ctx: Context, study: Study
) -> None:
    from analysis import plots, stats
    from baseline.models import GradingKind, JobStatus, ScoreLog, Task, TaskKind

    with ctx.session() as session:
        scored = session.scalars(
            select(Grading)
            .join(Snapshot)
            .join(Attempt)
            .join(Task)
            .where(
                Attempt.study_id == study.id,
                Task.kind == TaskKind.SCORED,
                Grading.kind == GradingKind.SCRIPT,
                Grading.status == JobStatus.SUCCEEDED,
                Snapshot.due_working_s == 8 * 3600.0,
            )
            .order_by(Grading.id)
        ).all()
        floored, crashed = scored[0], scored[1]
        floored.score, floored.raw_score, floored.floor_reason = 0.0, 0.91, "no_score"
        floored.error = "no_score: no solution.py in /home/submission"
        crashed.status, crashed.score, crashed.raw_score = JobStatus.FAILED, None, None
        crashed.error = "failed 3 times; last error: ScoringError: the scoring workspace failed"
        log = session.scalars(
            select(ScoreLog).where(ScoreLog.attempt_id == floored.snapshot.attempt_id)
        ).first()
        assert log is not None
        log.normalised_score, log.floor_reason = 0.0, "process_failed"
        log.error = "process_failed: the scoring script exited with code 1"
        ids = {"floored": floored.snapshot_id, "crashed": crashed.snapshot_id, "log": log.id}
        log_at = log.working_s / 3600.0
        attempt_id = floored.snapshot.attempt_id
    data = load_study(study.id, context=ctx)
    table = data.table
    at_floor = table[table["snapshot_id"] == ids["floored"]].iloc[0]
    assert at_floor["score"] == 0.0 and at_floor["floor"] == "no_score"
    assert pd.isna(at_floor["missing"])
    missing = table[table["snapshot_id"] == ids["crashed"]].iloc[0]
    assert math.isnan(missing["score"]) and missing["missing"] == "grading_failed"
    assert pd.isna(missing["floor"])
    logged = table[
        (table["attempt_id"] == attempt_id)
        & (table["source"] == "score_log")
        & (table["working_hours"] == log_at)
    ].iloc[0]
    assert logged["score"] == 0.0 and logged["floor"] == "process_failed"
    assert pd.isna(logged["missing"])

    traj = stats.trajectories(table, data.checkpoints, best_so_far=False)
    point = traj[(traj["attempt_id"] == attempt_id) & (traj["checkpoint_hours"] == 8.0)].iloc[0]
    assert (point["value"], point["state"], point["floor"]) == (0.0, "observed", "no_score")
    curves = stats.group_curves(traj)
    at8 = curves[(curves["group"] == point["group"]) & (curves["checkpoint_hours"] == 8.0)]
    assert at8["n_floor"].tolist() == [1]
    figure = plots.trajectories_figure(traj, curves, synthetic=True)
    text = " ".join(a.text.replace("<br>", " ") for a in figure.layout.annotations)
    assert "At the floor (the submission failed its scoring: a result, scored 0): no_score 1." in (
        text
    )
    assert "Missing (excluded, not 0): " in text and "grading_failed" in text
    # With best-so-far (scored tasks' default) an earlier logged score beats the floor, and the
    # point is not labelled as a floor.
    best = stats.trajectories(table, data.checkpoints)
    point = best[(best["attempt_id"] == attempt_id) & (best["checkpoint_hours"] == 8.0)].iloc[0]
    assert point["value"] > 0.0 and point["state"] == "best_so_far" and point["floor"] is None


def test_agreement_rows_come_in_snapshot_order(ctx: Context, study: Study) -> None:
    """Rows in a stable order, so an archive's copy and an export compare row for row: PostgreSQL
    returned them in the order the expert gradings were last written (CI, stop 51)."""
    first = load_study(study.name, context=ctx).agreement
    with ctx.session() as session:
        ids = session.scalars(
            select(Grading.id)
            .where(Grading.snapshot_id.in_(first["snapshot_id"].tolist()))
            .order_by(Grading.snapshot_id.desc())
        ).all()
        for grading_id in ids:  # rewritten last snapshot first: new row versions, new order
            session.execute(
                update(Grading).where(Grading.id == grading_id).values(score=Grading.score)
            )
    again = load_study(study.name, context=ctx).agreement
    assert again["snapshot_id"].tolist() == sorted(first["snapshot_id"].tolist())
