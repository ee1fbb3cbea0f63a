"""Builders for attempts under test: a study, a task, a human or agent participant, an attempt."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.orm import Session

from baseline import accounts, studies
from baseline.context import Context
from baseline.models import Attempt, Role, Task, TaskKind
from baseline.snapshots import DirectorySource, SourceResolver, SubmissionSource

_counter = itertools.count(1)


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


def directory_resolver(path: Path) -> SourceResolver:
    def resolve(_session: Session, _attempt: Attempt) -> SubmissionSource:
        return DirectorySource(str(path))

    return resolve
