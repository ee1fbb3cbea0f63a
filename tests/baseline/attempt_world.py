"""Builders for attempts under test: a study, a task, a human or agent participant, an attempt."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from baseline.attempts import attempts
from baseline.attempts.snapshots import DirectorySource, SourceResolver, SubmissionSource
from baseline.context import Context
from baseline.models import (
    AgentRun,
    Attempt,
    AttemptStatus,
    Host,
    Participant,
    ParticipantKind,
    Role,
    Snapshot,
    SnapshotKind,
    Study,
    Task,
    TaskKind,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.people import accounts
from baseline.studies import studies
from baseline.workspaces import terminal_records

_counter = itertools.count(1)


def agent_attempt_rows(
    session: Session,
    study: Study,
    task: Task,
    *,
    display_name: str = "agent",
    pseudonym: str = "P1",
    **fields: Any,
) -> Attempt:
    """An agent's attempt of `task` in `study`, its participant and attempt rows written as they
    are (no domain rule applied), for tests that need only the rows; `fields` are the attempt's
    (a one-hour cpu attempt unless they say otherwise)."""
    participant = Participant(
        study_id=study.id, kind=ParticipantKind.AGENT, display_name=display_name,
        pseudonym=pseudonym,
    )  # fmt: skip
    session.add(participant)
    session.flush()
    attempt = Attempt(
        study_id=study.id,
        participant_id=participant.id,
        task_id=task.id,
        **{"hardware_profile": "cpu", "working_time_limit_s": 3600.0, **fields},
    )
    session.add(attempt)
    session.flush()
    return attempt


def blobless_final_snapshot(session: Session, attempt_id: int) -> Snapshot:
    """A final snapshot row at 0 working seconds whose manifest blob is not stored, flushed (its
    id set): what routes and jobs meet when a snapshot's content is absent."""
    snapshot = Snapshot(
        attempt_id=attempt_id,
        kind=SnapshotKind.FINAL,
        due_working_s=0.0,
        taken_working_s=0.0,
        manifest_sha256="0" * 64,
    )
    session.add(snapshot)
    session.flush()
    return snapshot


def make_attempt(
    ctx: Context,
    *,
    human: bool = False,
    checkpoints: Sequence[float] = (2, 8, 32, 48),
    interval_minutes: float | None = None,
    limit_hours: float = 48.0,
    wall_cap_hours: float | None = None,
    time_scale: float = 1.0,
) -> int:
    n = next(_counter)
    with ctx.session() as session:
        spec = studies.StudySpec(
            name=f"Study {n}",
            checkpoint_hours=tuple(checkpoints),
            snapshot_interval_minutes=interval_minutes,
            working_time_limit_hours=limit_hours,
            wall_clock_limit_hours=wall_cap_hours,
            time_scale=time_scale,
        )
        study = studies.create_study(session, spec, None)
        task = Task(slug=f"task-{n}", title=f"Task {n}", kind=TaskKind.PAPER, content_hash="0" * 64)
        session.add(task)
        session.flush()
        studies.add_task(session, study, task, None)
        session.flush()
        session.refresh(study)
        if human:
            user = accounts.create_user(
                session, f"p{n}@test.example", f"Person {n}", "pw-long-enough-1", Role.PARTICIPANT
            )
            participant = studies.enroll_human(session, study.id, user, None)
        else:
            participant = studies.add_agent(
                session, study, f"agent {n}", "basic", "model-x", "http://127.0.0.1:1", None, None
            )
        return studies.create_attempt(session, participant, task, None).id


def running_command_run(ctx: Context) -> tuple[int, int]:
    """An agent attempt running under a command agent's run (no workspace): its and the run's
    ids."""
    attempt_id = make_attempt(ctx)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.status, attempt.started_at = AttemptStatus.RUNNING, utcnow()
        run = AgentRun(attempt_id=attempt_id, scaffold="command", model="pinned-model")
        session.add(run)
        session.flush()
        return attempt_id, run.id


def directory_resolver(path: Path) -> SourceResolver:
    def resolve(_session: Session, _attempt: Attempt) -> SubmissionSource:
        return DirectorySource(str(path))

    return resolve


@dataclass(frozen=True)
class HumanAttempt:
    attempt_id: int
    user_id: int
    email: str


def started_human_attempt(
    ctx: Context,
    tmp_path: Path,
    *,
    docker_url: str,
    running: bool = True,
    consented: bool = False,
    time_scale: float = 1.0,
) -> HumanAttempt:
    """A started human attempt whose workspace exists only as a row (host, container name):
    what the portal's hub routes and the hub watcher read, without Docker or a hub."""
    attempt_id = make_attempt(ctx, human=True, time_scale=time_scale)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path))
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        user = attempt.participant.user
        assert user is not None
        host = Host(name=f"h{attempt_id}", docker_url=docker_url, healthy=True)
        session.add(host)
        session.flush()
        session.add(
            Workspace(
                attempt_id=attempt_id,
                purpose=WorkspacePurpose.ATTEMPT,
                host_id=host.id,
                backend="docker",
                name=f"ws-a{attempt_id}-test",
                image="img",
                hardware_profile="cpu",
                status=WorkspaceStatus.RUNNING if running else WorkspaceStatus.STOPPED,
            )
        )
        if consented:
            terminal_records.accept_consent(session, attempt.participant, user.id)
        return HumanAttempt(attempt_id, user.id, user.email)
