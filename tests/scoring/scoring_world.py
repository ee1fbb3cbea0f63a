"""A study with the bundled demo paper task, one attempt and snapshots of a submission directory:
the starting point of the reproduction, grading and portal tests."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from baseline.attempts.snapshots import DirectorySource, take_snapshot
from baseline.context import Context
from baseline.models import Attempt, AttemptStatus, Role, SnapshotKind, Study, StudyStatus, Task
from baseline.people import accounts
from baseline.studies import studies
from baseline.tasks.tasks import demo_reference_submission, import_demo_tasks

PARTICIPANT_NAME = "Ada Lovelace-Participant"
AGENT_MODEL = "gpt-secret-model-7"


@dataclass
class ScoringWorld:
    study_id: int
    attempt_id: int
    agent_attempt_id: int
    task_id: int
    pseudonym: str
    agent_pseudonym: str


def build_world(ctx: Context, image_digest: str | None = None) -> ScoringWorld:
    """Study (demo tasks, cpu profile) with a human's and an agent's attempt on the paper task."""
    with ctx.session() as session:
        tasks: list[Task] = import_demo_tasks(session, ctx.settings)
        paper = next(t for t in tasks if t.slug == "digits-baselines")
        admin = accounts.create_user(
            session, "coord-world@test.example", "Coordinator", "pw-pw-pw-pw", Role.COORDINATOR
        )
        human = accounts.create_user(
            session, "ada@test.example", PARTICIPANT_NAME, "pw-pw-pw-pw", Role.PARTICIPANT
        )
        study = studies.create_study(
            session,
            studies.StudySpec(name="Scoring study", reproduction_timeout_minutes=5),
            admin.id,
        )
        studies.add_task(session, study, paper, admin.id)
        session.flush()
        session.refresh(study)
        person = studies.enroll_human(session, study.id, human, admin.id)
        agent = studies.add_agent(
            session, study, "Agent Smith", "iterative", AGENT_MODEL, "http://x", None, admin.id
        )
        attempts: list[Attempt] = []
        for participant in (person, agent):
            attempt = studies.create_attempt(session, participant, paper, admin.id)
            attempt.image_digest = image_digest
            attempt.status = AttemptStatus.SUBMITTED
            attempts.append(attempt)
        session.flush()
        return ScoringWorld(
            study_id=study.id,
            attempt_id=attempts[0].id,
            agent_attempt_id=attempts[1].id,
            task_id=paper.id,
            pseudonym=person.pseudonym,
            agent_pseudonym=agent.pseudonym,
        )


def snapshot_reference(
    ctx: Context, attempt_id: int, root: Path, kind: SnapshotKind = SnapshotKind.FINAL,
    edit: dict[str, str] | None = None, due_working_s: float | None = None,
) -> int:  # fmt: skip
    """Snapshot a copy of the demo reference submission (optionally edited); its id."""
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(demo_reference_submission(), root)
    for path, text in (edit or {}).items():
        (root / path).write_text(text)
    return take_snapshot(ctx, attempt_id, kind, due_working_s, DirectorySource(str(root))).id


def set_study_status(ctx: Context, study_id: int, status: StudyStatus) -> None:
    """As a coordinator sets it (`studies.set_status`, its rules and audit)."""
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        studies.set_status(session, study, status, None)
