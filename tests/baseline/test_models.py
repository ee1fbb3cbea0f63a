"""The data model on SQLite and PostgreSQL: migrations, every entity, constraints, time zones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, select
from sqlalchemy.exc import IntegrityError

from baseline import migrate
from baseline.context import Context
from baseline.db import Base
from baseline.models import (
    ApiToken,
    Attempt,
    AuditEvent,
    EgressEvent,
    FileVisibility,
    GpuAssignment,
    Grading,
    GradingKind,
    Host,
    Invitation,
    JobStatus,
    LeafGrade,
    ModelCall,
    Participant,
    ParticipantKind,
    Pause,
    PauseReason,
    Reproduction,
    Role,
    ScoreLog,
    Snapshot,
    SnapshotKind,
    Study,
    StudyTask,
    Task,
    TaskFile,
    TaskKind,
    User,
    Workspace,
    WorkspacePurpose,
)


def test_upgrade_empty_database_to_head(empty_database_url: str) -> None:
    database_url = empty_database_url
    migrate.upgrade(database_url)
    engine = create_engine(database_url)
    try:
        tables = set(inspect(engine).get_table_names())
        assert set(Base.metadata.tables) <= tables
        assert migrate.current_revision(engine) == migrate.head_revision(database_url)
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"models and migrations differ: {diff}"
    finally:
        engine.dispose()


def test_upgrade_is_idempotent(empty_database_url: str) -> None:
    database_url = empty_database_url
    migrate.upgrade(database_url)
    migrate.upgrade(database_url)


def test_every_entity_round_trips(ctx: Context) -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    with ctx.session() as s:
        user = User(email="u@x.org", name="U", password_hash="h", role=Role.PARTICIPANT)
        study = Study(name="S", checkpoint_hours=[2.0, 8.0])
        task = Task(
            slug="t", title="T", kind=TaskKind.PAPER, content_hash="a" * 64, summary={"leaves": 3}
        )
        s.add_all([user, study, task])
        s.flush()
        s.add(
            TaskFile(
                task=task,
                path="paper.md",
                sha256="b" * 64,
                size=3,
                visibility=FileVisibility.PARTICIPANT,
            )
        )
        s.add(StudyTask(study=study, task=task))
        s.add(ApiToken(user=user, name="n", prefix="bl_x", token_hash="c" * 64))
        s.add(Invitation(token_hash="d" * 64, expires_at=at, study_id=study.id))
        p = Participant(
            study=study, kind=ParticipantKind.HUMAN, display_name="U", pseudonym="P-1", user=user
        )
        agent = Participant(
            study=study,
            kind=ParticipantKind.AGENT,
            display_name="A",
            pseudonym="P-2",
            agent_model="m",
            agent_scaffold="basic",
            agent_limits={"tokens": 10},
        )
        s.add_all([p, agent])
        s.flush()
        attempt = Attempt(
            study_id=study.id,
            participant=p,
            task=task,
            hardware_profile="cpu",
            working_time_limit_s=3600.0,
            started_at=at,
        )
        s.add(attempt)
        s.flush()
        s.add(Pause(attempt=attempt, started_at=at, reason=PauseReason.NOT_STARTED))
        snap = Snapshot(
            attempt=attempt,
            kind=SnapshotKind.CHECKPOINT,
            due_working_s=7200,
            taken_working_s=7201,
            manifest_sha256="e" * 64,
            taken_at=at,
        )
        s.add(snap)
        s.flush()
        repro = Reproduction(snapshot=snap, details={"files_before": 1})
        s.add(repro)
        s.flush()
        grading = Grading(snapshot=snap, reproduction_id=repro.id, kind=GradingKind.JUDGE)
        s.add(grading)
        s.flush()
        s.add(LeafGrade(grading=grading, leaf_path="0.1", leaf_id="x", score=1.0, valid=True))
        s.add(
            ModelCall(
                study_id=study.id,
                grading_id=grading.id,
                purpose="grade",
                model="m",
                prompt_tokens=10,
                completion_tokens=2,
                cost_usd=0.01,
            )
        )
        s.add(ScoreLog(attempt_id=attempt.id, working_s=60.0, raw_score=0.5))
        host = Host(
            name="local",
            docker_url="unix:///var/run/docker.sock",
            gpus=[{"index": 0, "uuid": "GPU-1"}],
        )
        s.add(host)
        s.flush()
        ws = Workspace(
            attempt_id=attempt.id,
            purpose=WorkspacePurpose.ATTEMPT,
            host_id=host.id,
            backend="docker",
            name="ws-1",
            image="img",
            hardware_profile="cpu",
        )
        s.add(ws)
        s.flush()
        s.add(GpuAssignment(host_id=host.id, device_index=0, workspace_id=ws.id))
        s.add(
            EgressEvent(
                workspace_id=ws.id,
                workspace_name="ws-1",
                method="GET",
                url="https://x.org/",
                allowed=False,
            )
        )
        s.add(AuditEvent(action="a", target_type="t", details={"k": [1, 2]}))
    with ctx.session() as s:
        attempt = s.scalars(select(Attempt)).one()
        assert attempt.started_at == at and attempt.started_at.tzinfo is not None
        assert attempt.participant.group == "human"
        assert (
            s.scalars(select(Participant).where(Participant.kind == ParticipantKind.AGENT))
            .one()
            .group
            == "basic:m"
        )
        assert s.scalars(select(Study)).one().checkpoint_hours == [2.0, 8.0]
        assert s.scalars(select(Task)).one().summary == {"leaves": 3}
        assert s.scalars(select(LeafGrade)).one().score == 1.0
        assert s.scalars(select(AuditEvent)).one().details == {"k": [1, 2]}


def test_naive_datetimes_are_refused(ctx: Context) -> None:
    with pytest.raises(Exception, match="naive datetime"), ctx.session() as s:
        s.add(Invitation(token_hash="f" * 64, expires_at=datetime(2026, 1, 1)))
        s.flush()


def test_one_gpu_never_has_two_live_assignments(ctx: Context) -> None:
    with ctx.session() as s:
        host = Host(name="h", docker_url="ssh://x")
        s.add(host)
        s.flush()
        ws = [
            Workspace(
                purpose=WorkspacePurpose.ATTEMPT,
                backend="docker",
                name=f"w{i}",
                image="i",
                hardware_profile="h100",
                host_id=host.id,
            )
            for i in range(3)
        ]
        s.add_all(ws)
        s.flush()
        first = GpuAssignment(host_id=host.id, device_index=0, workspace_id=ws[0].id)
        s.add(first)
        s.flush()
        host_id, ids = host.id, [w.id for w in ws]
    with pytest.raises(IntegrityError), ctx.session() as s:
        s.add(GpuAssignment(host_id=host_id, device_index=0, workspace_id=ids[1]))
        s.flush()
    with ctx.session() as s:
        live = s.scalars(select(GpuAssignment)).one()
        live.released_at = datetime.now(UTC) + timedelta(seconds=1)
        s.flush()
        s.add(GpuAssignment(host_id=host_id, device_index=0, workspace_id=ids[2]))


def test_unknown_enum_value_is_refused(ctx: Context) -> None:
    with pytest.raises(Exception), ctx.session() as s:  # noqa: B017
        s.add(User(email="z@x.org", name="Z", password_hash="h", role="emperor"))
        s.flush()


def test_deleting_a_study_removes_its_participants(ctx: Context) -> None:
    with ctx.session() as s:
        study = Study(name="gone")
        s.add(study)
        s.flush()
        s.add(
            Participant(study=study, kind=ParticipantKind.AGENT, display_name="a", pseudonym="P-9")
        )
    with ctx.session() as s:
        s.delete(s.scalars(select(Study)).one())
    with ctx.session() as s:
        assert s.scalars(select(Participant)).all() == []


def test_a_sandbox_workspace_under_a_deep_home_is_stored(ctx: Context) -> None:
    """The local sandbox's container id is its directory under BASELINE_HOME (seen: 110
    characters under a pytest-xdist worker's temporary directory, refused by PostgreSQL at 100)."""
    deep = "/srv/" + "/".join(["a-rather-long-directory-name"] * 20) + "/sandbox/workspaces/ws-a1"
    with ctx.session() as s:
        s.add(
            Workspace(
                purpose=WorkspacePurpose.REPRODUCTION,
                backend="local",
                name="ws-deep",
                container_id=deep,
                image="host",
                hardware_profile="cpu",
            )
        )
    with ctx.session() as s:
        stored = s.scalar(select(Workspace).where(Workspace.name == "ws-deep"))
        assert stored is not None and stored.container_id == deep


def test_the_floor_migration_turns_a_participant_s_failed_scoring_into_a_floor_result(
    ctx: Context,
) -> None:
    """Rows stored before migration 0002 get its rule: the submission's failure (typed error)
    is the task's floor; Baseline's failure and a Task Standard family's manual-scoring None stay
    as they were."""
    from alembic import command

    from analysis.seed import seed_synthetic_study

    with ctx.session() as session:
        study = seed_synthetic_study(session, name="floor migration", seed=3)
        gradings = session.scalars(
            select(Grading)
            .join(Snapshot)
            .join(Attempt)
            .join(Task)
            .where(Attempt.study_id == study.id, Grading.kind == GradingKind.SCRIPT)
            .order_by(Task.id, Grading.id)
        ).all()
        by_task: dict[int, list[Grading]] = {}
        for grading in gradings:
            by_task.setdefault(grading.snapshot.attempt.task_id, []).append(grading)
        first_task, second_task = list(by_task)[:2]
        submission_fault, baseline_fault = by_task[first_task][:2]
        manual = by_task[second_task][0]
        session.get(Task, second_task).scoring = {  # type: ignore[union-attr]
            "script": "family/hook.py",
            "starting_score": 0.0,
            "reference_score": 1.0,
            "task_standard": {"family": "f"},
        }
        start = float(session.get(Task, first_task).scoring["starting_score"])  # type: ignore[union-attr,index]
        for grading, error in (
            (submission_fault, "no_score: no solution.py in /home/submission"),
            (baseline_fault, "scoring could not run: the scoring workspace failed"),
            (manual, "no_score: the family's score() returned None (manual scoring)"),
        ):
            grading.status, grading.score, grading.raw_score, grading.error = (
                JobStatus.FAILED,
                None,
                None,
                error,
            )
        log = session.scalars(
            select(ScoreLog).where(ScoreLog.attempt_id == submission_fault.snapshot.attempt_id)
        ).first()
        assert log is not None
        log.normalised_score, log.raw_score = None, None
        log.error = "timed_out: the scoring script ran past its limit of 300 s"
        ids = (submission_fault.id, baseline_fault.id, manual.id, log.id)
    ctx.engine.dispose()
    config = migrate.alembic_config(ctx.settings.database_url)
    command.downgrade(config, "0001")
    command.upgrade(config, "head")

    with ctx.session() as session:
        floored, kept, manual_kept = (session.get(Grading, i) for i in ids[:3])
        migrated_log = session.get(ScoreLog, ids[3])
        assert floored is not None and kept is not None and manual_kept is not None
        assert migrated_log is not None
        assert (floored.status, floored.score, floored.raw_score, floored.floor_reason) == (
            JobStatus.SUCCEEDED,
            0.0,
            start,
            "no_score",
        )
        assert floored.error == "no_score: no solution.py in /home/submission"  # why, kept
        for unchanged in (kept, manual_kept):
            assert (unchanged.status, unchanged.score, unchanged.floor_reason) == (
                JobStatus.FAILED,
                None,
                None,
            )
        assert (migrated_log.normalised_score, migrated_log.floor_reason) == (0.0, "timed_out")
