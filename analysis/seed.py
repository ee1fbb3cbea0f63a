"""Write a synthetic study into the database, so the portal and `baseline demo` show real figures.

The attempts are drawn from `analysis.synthetic` (RE-Bench-shaped scored tasks and
PaperBench-shaped paper tasks, humans against two agent configurations) and stored as the real
pipeline would store them: attempts, checkpoint snapshots, reproductions, gradings with
category scores, intermediate score logs, agent model calls, and a few expert gradings with leaf
grades for judge agreement. Some data are missing on purpose: attempts that ended early,
incomplete or failed gradings, one snapshot not graded yet. Every task is marked
``summary["synthetic"] = True`` so that every figure made from it says SYNTHETIC.
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from analysis.synthetic import (
    GroupSpec,
    SimAttempt,
    SyntheticSpec,
    category_scores,
    re_bench_spec,
    simulate,
)
from baseline import studies
from baseline.models import (
    Attempt,
    AttemptStatus,
    Grading,
    GradingKind,
    JobStatus,
    LeafGrade,
    ModelCall,
    Participant,
    ParticipantKind,
    Reproduction,
    ScoreLog,
    Snapshot,
    SnapshotKind,
    Study,
    StudyTask,
    Task,
    TaskKind,
)

DEFAULT_NAME = "Synthetic study (RE-Bench-shaped)"
LEAVES = 20
WALL_PER_WORKING = 1.3  # wall hours per working hour (breaks)
EPOCH = datetime(2025, 1, 6, 9, 0, tzinfo=UTC)
_Row = TypeVar("_Row")


def _specs(seed: int) -> list[SyntheticSpec]:
    base = re_bench_spec(n_tasks=3, humans=3, agents=4, seed=seed)
    weak = GroupSpec(
        name="basic:model-b",
        kind="agent",
        scaffold="basic",
        model="model-b",
        knots={h: 0.6 * v for h, v in base.group("iterative:model-a").knots.items()},
        attempts_per_task=4,
        api_cost_per_hour_usd=6.0,
    )
    scored = base.model_copy(
        update={"groups": [*base.groups, weak], "p_ended_early": 0.1, "p_incomplete": 0.05}
    )
    # PaperBench-shaped: scores in [0, 1], humans near 0.4 at the end.
    paper_groups = [
        g.model_copy(update={"knots": {h: 0.33 * v for h, v in g.knots.items()}})
        for g in scored.groups
    ]
    paper = scored.model_copy(
        update={"groups": paper_groups, "task_kind": "paper", "n_tasks": 2, "seed": seed + 1}
    )
    return [scored, paper]


def seed_synthetic_study(session: Session, name: str = DEFAULT_NAME, seed: int = 0) -> Study:
    """Create the study named `name` unless it exists (then it is returned unchanged)."""
    existing = session.scalar(select(Study).where(Study.name == name))
    if existing is not None:
        return existing
    specs = _specs(seed)
    study = studies.create_study(
        session,
        studies.StudySpec(
            name=name,
            description=(
                "SYNTHETIC data drawn from a model with a known ground truth (RE-Bench-shaped: "
                "agents ahead early, humans ahead after about 7 working hours)."
            ),
            checkpoint_hours=specs[0].checkpoints,
            working_time_limit_hours=specs[0].checkpoints[-1],
            human_hourly_rate_usd=specs[0].human_hourly_rate_usd,
        ),
        actor_id=None,
    )
    participants = _participants(session, study, specs[0])
    rng = np.random.default_rng(seed)
    first_attempt = True
    for spec in specs:
        tasks = [_task(session, study, spec, n) for n in range(spec.n_tasks)]
        for sim in simulate(spec):
            participant = participants[(sim.group, sim.index if sim.group == "human" else 0)]
            attempt = _attempt(session, study, participant, tasks[sim.task], sim, spec)
            _measurements(session, study, attempt, sim, spec, rng, skip_last=first_attempt)
            first_attempt = False
    session.flush()
    return study


def _participants(
    session: Session, study: Study, spec: SyntheticSpec
) -> dict[tuple[str, int], Participant]:
    out: dict[tuple[str, int], Participant] = {}
    for group in spec.groups:
        if group.kind == "human":
            for i in range(group.attempts_per_task):
                out[(group.name, i)] = _add(
                    session,
                    Participant(
                        study_id=study.id,
                        kind=ParticipantKind.HUMAN,
                        display_name=f"Synthetic human {i + 1}",
                        pseudonym=f"S-H{i + 1:02d}",
                    ),
                )
        else:
            out[(group.name, 0)] = _add(
                session,
                Participant(
                    study_id=study.id,
                    kind=ParticipantKind.AGENT,
                    display_name=f"Synthetic agent {group.name}",
                    pseudonym=f"S-{hashlib.sha256(group.name.encode()).hexdigest()[:6].upper()}",
                    agent_scaffold=group.scaffold,
                    agent_model=group.model,
                    agent_endpoint="synthetic://none",
                    agent_limits={},
                ),
            )
    return out


def _add(session: Session, row: _Row) -> _Row:
    session.add(row)
    session.flush()
    return row


def _task(session: Session, study: Study, spec: SyntheticSpec, n: int) -> Task:
    slug = f"synthetic-{study.id}-{spec.task_kind}-{n + 1}"
    task = _add(
        session,
        Task(
            slug=slug,
            title=f"Synthetic {spec.task_kind} task {n + 1}",
            kind=TaskKind.SCORED if spec.task_kind == "scored" else TaskKind.PAPER,
            content_hash=hashlib.sha256(slug.encode()).hexdigest(),
            summary={"synthetic": True},
            scoring=(
                {"starting_score": 0.0, "reference_score": 1.0}
                if spec.task_kind == "scored"
                else None
            ),
        ),
    )
    session.add(StudyTask(study_id=study.id, task_id=task.id))
    return task


def _attempt(
    session: Session,
    study: Study,
    participant: Participant,
    task: Task,
    sim: SimAttempt,
    spec: SyntheticSpec,
) -> Attempt:
    last = len(spec.checkpoints) - 1
    started = EPOCH + timedelta(days=sim.task * 3 + sim.index)
    worked = spec.checkpoints[sim.ended_after]
    if sim.ended_after == last:
        status, reason = AttemptStatus.ENDED, "working-time limit reached"
    elif sim.index % 2:
        status, reason = AttemptStatus.SUBMITTED, "submitted early"
    else:
        status, reason = AttemptStatus.FAILED, "workspace died"
    return _add(
        session,
        Attempt(
            study_id=study.id,
            participant_id=participant.id,
            task_id=task.id,
            status=status,
            hardware_profile=study.hardware_profile,
            working_time_limit_s=spec.checkpoints[-1] * 3600.0,
            started_at=started,
            first_login_at=started,
            ended_at=started + timedelta(hours=worked * WALL_PER_WORKING + 0.1),
            end_reason=reason,
        ),
    )


def _measurements(
    session: Session,
    study: Study,
    attempt: Attempt,
    sim: SimAttempt,
    spec: SyntheticSpec,
    rng: np.random.Generator,
    skip_last: bool,
) -> None:
    started = attempt.started_at or EPOCH
    group = spec.group(sim.group)
    paper = spec.task_kind == "paper"
    for c, hours in enumerate(spec.checkpoints[: sim.ended_after + 1]):
        taken_at = started + timedelta(hours=hours * WALL_PER_WORKING)
        snap = _add(
            session,
            Snapshot(
                attempt_id=attempt.id,
                kind=SnapshotKind.CHECKPOINT,
                due_working_s=hours * 3600.0,
                taken_working_s=hours * 3600.0,
                taken_at=taken_at,
                manifest_sha256=hashlib.sha256(
                    f"synthetic:{attempt.id}:{hours}".encode()
                ).hexdigest(),
                source="synthetic",
            ),
        )
        if skip_last and c == sim.ended_after:
            continue  # left ungraded on purpose: shown as "not_graded"
        score = float(min(sim.scores[c], 1.0) if paper else sim.scores[c])
        repro = _reproduction(session, snap, sim.failure_class[c]) if paper else None
        grading = _grading(session, snap, repro, score, sim.incomplete[c], paper, taken_at)
        if paper and hours == 8.0 and sim.index < 2 and grading.status is JobStatus.SUCCEEDED:
            _expert_pair(session, snap, grading, score, rng)
    for when, score in sim.logs:
        session.add(
            ScoreLog(
                attempt_id=attempt.id,
                working_s=when * 3600.0,
                raw_score=score,
                normalised_score=score,
                created_at=started + timedelta(hours=when * WALL_PER_WORKING),
            )
        )
    if group.kind == "agent":
        worked = spec.checkpoints[sim.ended_after]
        for half in range(1, math.floor(worked * 2) + 1):
            session.add(
                ModelCall(
                    study_id=study.id,
                    attempt_id=attempt.id,
                    purpose="agent",
                    model=group.model or "?",
                    prompt_tokens=40_000,
                    completion_tokens=2_000,
                    cost_usd=group.api_cost_per_hour_usd / 2,
                    created_at=started + timedelta(hours=half / 2 * WALL_PER_WORKING),
                )
            )


def _reproduction(session: Session, snap: Snapshot, failure: str | None) -> Reproduction:
    return _add(
        session,
        Reproduction(
            snapshot_id=snap.id,
            status=JobStatus.SUCCEEDED,
            started_at=snap.taken_at,
            finished_at=snap.taken_at + timedelta(minutes=20),
            exit_code=1 if failure else 0,
            duration_s=1200.0,
            failure_class=failure,
        ),
    )


def _grading(
    session: Session,
    snap: Snapshot,
    repro: Reproduction | None,
    score: float,
    incomplete: bool,
    paper: bool,
    at: datetime,
) -> Grading:
    if paper:
        invalid = 3 if incomplete else 0
        return _add(
            session,
            Grading(
                snapshot_id=snap.id,
                reproduction_id=None if repro is None else repro.id,
                kind=GradingKind.JUDGE,
                status=JobStatus.INCOMPLETE if incomplete else JobStatus.SUCCEEDED,
                score=score,
                leaves_total=LEAVES,
                leaves_graded=LEAVES - invalid,
                leaves_invalid=invalid,
                category_scores=category_scores(score),
                cost_usd=3.3,
                created_at=at,
                finished_at=at + timedelta(minutes=40),
            ),
        )
    return _add(
        session,
        Grading(
            snapshot_id=snap.id,
            kind=GradingKind.SCRIPT,
            status=JobStatus.FAILED if incomplete else JobStatus.SUCCEEDED,
            score=None if incomplete else score,
            raw_score=None if incomplete else score,
            error="scoring script timed out" if incomplete else None,
            created_at=at,
            finished_at=at + timedelta(minutes=5),
        ),
    )


def _expert_pair(
    session: Session, snap: Snapshot, judge: Grading, score: float, rng: np.random.Generator
) -> None:
    """Leaf grades for the judge and an expert who agrees on about 85% of leaves."""
    judged = (rng.random(LEAVES) < score).astype(float)
    expert = np.where(rng.random(LEAVES) < 0.85, judged, 1.0 - judged)
    grading = _add(
        session,
        Grading(
            snapshot_id=snap.id,
            kind=GradingKind.EXPERT,
            status=JobStatus.SUCCEEDED,
            score=float(expert.mean()),
            leaves_total=LEAVES,
            leaves_graded=LEAVES,
            created_at=snap.taken_at + timedelta(days=2),
        ),
    )
    for i in range(LEAVES):
        for owner, value in ((judge, judged[i]), (grading, expert[i])):
            session.add(
                LeafGrade(
                    grading_id=owner.id,
                    leaf_path=f"0.{i}",
                    leaf_id=f"leaf-{i}",
                    score=float(value),
                    valid=True,
                )
            )
