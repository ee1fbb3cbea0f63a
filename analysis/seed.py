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
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
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
    Pause,
    PauseReason,
    Reproduction,
    ScoreLog,
    Snapshot,
    SnapshotKind,
    Study,
    StudyStatus,
    StudyTask,
    Task,
    TaskFile,
    TaskKind,
)
from baseline.studies import studies
from baseline.tasks import tasks
from infra.blobs import BlobStore
from infra.snapshots import capture_directory
from scoring.failure import FailureClass
from scoring.rubric import format_path

DEFAULT_NAME = "Synthetic study (RE-Bench-shaped)"
LEAVES = 20
WALL_PER_WORKING = 1.3  # wall hours per working hour (the breaks are pauses)
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


# The scored demo task's starting solution: what a synthetic scored submission holds.
SCORED_STARTING = tasks.DEMO_TASKS_DIR / "digits-accuracy" / "starting"


class _Content:
    """The real files behind the synthetic rows: demo task files and captured snapshots."""

    def __init__(self, session: Session, store: BlobStore) -> None:
        self.store = store
        demo = {
            t.kind: t
            for t in (
                tasks.import_task(session, store, tasks.DEMO_TASKS_DIR / name).task
                for name in tasks.DEMO_TASKS
            )
        }
        self.paper, self.scored = demo[TaskKind.PAPER], demo[TaskKind.SCORED]
        rubric = tasks.load_task_rubric(session, store, self.paper)
        self.leaf_paths = [format_path(path) for path, _ in rubric.leaves()]
        self.work = Path(tempfile.mkdtemp(prefix="bl-synthetic-"))

    def files_of(self, kind: TaskKind) -> list[TaskFile]:
        source = self.paper if kind is TaskKind.PAPER else self.scored
        return [
            TaskFile(path=f.path, sha256=f.sha256, size=f.size, visibility=f.visibility)
            for f in source.files
        ]

    def summary_of(self, kind: TaskKind) -> dict[str, object]:
        """The demo task's summary (a paper's rubric size), whose files the synthetic task has."""
        source = self.paper if kind is TaskKind.PAPER else self.scored
        return dict(source.summary or {})

    def scoring(self) -> dict[str, object] | None:
        return dict(self.scored.scoring) if self.scored.scoring else None

    def snapshot(
        self, kind: TaskKind, attempt_id: int, hours: float, score: float, failure: str | None
    ) -> tuple[str, int, int]:
        """Capture a submission folder; returns (manifest sha256, files, bytes). A paper
        submission whose reproduction `failure` is a missing reproduce.sh lacks that file, as
        its grading page and reproduction say."""
        folder = self.work / f"a{attempt_id}-h{hours:g}"
        source = tasks.demo_reference_submission() if kind is TaskKind.PAPER else SCORED_STARTING
        shutil.copytree(source, folder)
        if failure == FailureClass.MISSING_REPRODUCE_SH:
            (folder / "reproduce.sh").unlink()
        (folder / "SYNTHETIC.md").write_text(
            f"# Synthetic snapshot\n\nDrawn by analysis.synthetic: after {hours:g} working "
            f"hours the modelled score is {score:.3f}. The other files are the bundled demo "
            "task's, so every page can show real content.\n"
        )
        return self._capture(folder)

    def start(self, kind: TaskKind, attempt_id: int) -> tuple[str, int, int]:
        """The submission at the start, as a real attempt's start snapshot holds it: a scored
        task's starting solution, and nothing written yet for a paper."""
        folder = self.work / f"a{attempt_id}-start"
        if kind is TaskKind.PAPER:
            folder.mkdir()
        else:
            shutil.copytree(SCORED_STARTING, folder)
        (folder / "SYNTHETIC.md").write_text(
            "# Synthetic snapshot\n\nThe start: nothing worked on yet (score 0 by construction).\n"
        )
        return self._capture(folder)

    def _capture(self, folder: Path) -> tuple[str, int, int]:
        captured = capture_directory(folder, self.store, source="synthetic")
        shutil.rmtree(folder, ignore_errors=True)
        return captured.manifest_sha256, captured.file_count, captured.manifest.total_bytes

    def log(self, failure: str | None) -> str:
        text = "$ bash reproduce.sh\n(synthetic reproduction: no command was run)\n"
        text += f"failed: {failure}\n" if failure else "exit 0\n"
        return self.store.put_bytes(text.encode())

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def seed_synthetic_study(
    session: Session,
    name: str = DEFAULT_NAME,
    seed: int = 0,
    store: BlobStore | None = None,
) -> Study:
    """Create the study named `name` unless it exists (then it is returned unchanged). With a
    blob store, every snapshot, task file and reproduction log is real content."""
    existing = session.scalar(select(Study).where(Study.name == name))
    if existing is not None:
        return existing
    content = _Content(session, store) if store is not None else None
    try:
        return _seed(session, name, seed, content)
    finally:
        if content is not None:
            content.close()


def _seed(session: Session, name: str, seed: int, content: _Content | None) -> Study:
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
        made = [_task(session, study, spec, n, content) for n in range(spec.n_tasks)]
        sims = list(simulate(spec))
        attempts = [
            _attempt(
                session,
                study,
                participants[(sim.group, sim.index if sim.group == "human" else 0)],
                made[sim.task],
                sim,
                spec,
            )
            for sim in sims
        ]
        session.flush()  # the attempts' ids name their snapshots
        for sim, attempt in zip(sims, attempts, strict=True):
            _measurements(
                session, study, attempt, sim, spec, rng, skip_last=first_attempt, content=content
            )
            first_attempt = False
    # Every attempt above has run to its end: the study is finished, as a real one is once its
    # last attempt ended and its coordinator closed it (a draft is one no attempt started in);
    # closed as a coordinator would, so its audit log says when.
    studies.set_status(session, study, StudyStatus.CLOSED, None)
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
                        pseudonym=studies.new_pseudonym(session, study.id),
                    ),
                )
        else:
            out[(group.name, 0)] = _add(
                session,
                Participant(
                    study_id=study.id,
                    kind=ParticipantKind.AGENT,
                    display_name=f"Synthetic agent {group.name}",
                    pseudonym=studies.new_pseudonym(session, study.id),
                    agent_scaffold=group.scaffold,
                    agent_model=group.model,
                    agent_endpoint="synthetic://none",
                    agent_limits={},
                ),
            )
    return out


def _add(session: Session, row: _Row) -> _Row:
    """Add `row` and flush it, for the rows whose id the next rows are made with."""
    session.add(row)
    session.flush()
    return row


def _add_later(session: Session, row: _Row) -> _Row:
    """Add `row` to the next flush, which inserts each table's pending rows in one statement:
    a flush per row took a fifth (SQLite) to a third (PostgreSQL) of a synthetic study's
    seeding, which most analysis tests and the demo do."""
    session.add(row)
    return row


def _task(
    session: Session, study: Study, spec: SyntheticSpec, n: int, content: _Content | None
) -> Task:
    slug = f"synthetic-{study.id}-{spec.task_kind}-{n + 1}"
    kind = TaskKind.SCORED if spec.task_kind == "scored" else TaskKind.PAPER
    scoring: dict[str, object] | None = None
    if kind is TaskKind.SCORED:
        scoring = content.scoring() if content is not None else None
        scoring = scoring or {"script": "score.py", "starting_score": 0.0, "reference_score": 1.0}
    task = _add(
        session,
        Task(
            slug=slug,
            title=f"Synthetic {spec.task_kind} task {n + 1}",
            kind=kind,
            content_hash=hashlib.sha256(slug.encode()).hexdigest(),
            summary={
                **(content.summary_of(kind) if content is not None else {}),
                "synthetic": True,
            },
            scoring=scoring,
            files=content.files_of(kind) if content is not None else [],
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
    if sim.ended_after == last:
        status, reason = AttemptStatus.ENDED, "working-time limit reached"
    elif sim.index % 2:
        status, reason = AttemptStatus.SUBMITTED, "submitted early"
    else:
        status, reason = AttemptStatus.FAILED, "workspace died"
    attempt = _add_later(
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
            ended_at=_wall(started, spec.checkpoints[sim.ended_after]),
            end_reason=reason,
        ),
    )
    # The breaks: in each stretch between checkpoints, a pause of (WALL_PER_WORKING - 1) of it,
    # so the working clock reads exactly the checkpoint's hours at each snapshot. An agent takes
    # no break: its clock stops while its provider holds it back.
    if participant.kind is ParticipantKind.AGENT:
        why, note = PauseReason.RATE_LIMIT, "waiting on the model provider (synthetic)"
    else:
        why, note = PauseReason.PARTICIPANT, "break (synthetic)"
    previous = 0.0
    for hours in spec.checkpoints[: sim.ended_after + 1]:
        stretch = hours - previous
        pause_start = _wall(started, previous) + timedelta(hours=stretch / 2)
        session.add(
            Pause(
                attempt=attempt,
                started_at=pause_start,
                ended_at=pause_start + timedelta(hours=stretch * (WALL_PER_WORKING - 1)),
                reason=why,
                note=note,
            )
        )
        previous = hours
    return attempt


def _wall(started: datetime, working_hours: float) -> datetime:
    """The wall time at which a synthetic attempt has worked `working_hours`."""
    return started + timedelta(hours=working_hours * WALL_PER_WORKING)


def _measurements(
    session: Session,
    study: Study,
    attempt: Attempt,
    sim: SimAttempt,
    spec: SyntheticSpec,
    rng: np.random.Generator,
    skip_last: bool,
    content: _Content | None = None,
) -> None:
    started = attempt.started_at or EPOCH
    group = spec.group(sim.group)
    paper = spec.task_kind == "paper"
    kind = TaskKind.PAPER if paper else TaskKind.SCORED
    scoring = attempt.task.scoring or {}
    start, reference = scoring.get("starting_score", 0.0), scoring.get("reference_score", 1.0)

    def raw(normalised: float) -> float:
        return float(start + normalised * (reference - start))

    _start(session, attempt, kind, raw(0.0), content)
    for c, hours in enumerate(spec.checkpoints[: sim.ended_after + 1]):
        taken_at = _wall(started, hours)
        score = float(min(sim.scores[c], 1.0) if paper else sim.scores[c])
        manifest = hashlib.sha256(f"synthetic:{attempt.id}:{hours}".encode()).hexdigest()
        files = size = 0
        failure = sim.failure_class[c] if paper else None
        if content is not None:
            manifest, files, size = content.snapshot(kind, attempt.id, hours, score, failure)
        snap = _add_later(
            session,
            Snapshot(
                attempt_id=attempt.id,
                kind=SnapshotKind.CHECKPOINT,
                due_working_s=hours * 3600.0,
                taken_working_s=hours * 3600.0,
                taken_at=taken_at,
                manifest_sha256=manifest,
                file_count=files,
                total_bytes=size,
                source="synthetic",
            ),
        )
        if skip_last and c == sim.ended_after:
            continue  # left ungraded on purpose: shown as "not_graded"
        repro = _reproduction(session, snap, failure, content) if paper else None
        grading = _grading(session, snap, repro, score, sim.incomplete[c], paper, taken_at)
        if not paper and grading.raw_score is not None:
            grading.raw_score = raw(score)
        if paper and hours == 8.0 and sim.index < 2 and grading.status is JobStatus.SUCCEEDED:
            leaf_paths = content.leaf_paths if content is not None else None
            _expert_pair(session, snap, grading, score, rng, leaf_paths)
    for when, score in sim.logs:
        session.add(
            ScoreLog(
                attempt_id=attempt.id,
                working_s=when * 3600.0,
                raw_score=raw(score),
                normalised_score=score,
                status=JobStatus.SUCCEEDED,
                created_at=_wall(started, when),
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
                    created_at=_wall(started, half / 2),
                )
            )


def _start(
    session: Session, attempt: Attempt, kind: TaskKind, raw: float, content: _Content | None
) -> None:
    """The attempt's start snapshot, at the floor as a real one is: a scored task's starting
    solution scores its starting score (normalised 0); a paper's empty submission has no
    reproduce.sh and is judged 0."""
    started = attempt.started_at or EPOCH
    manifest = hashlib.sha256(f"synthetic:{attempt.id}:start".encode()).hexdigest()
    files = size = 0
    if content is not None:
        manifest, files, size = content.start(kind, attempt.id)
    snap = _add_later(
        session,
        Snapshot(
            attempt_id=attempt.id,
            kind=SnapshotKind.START,
            due_working_s=0.0,
            taken_working_s=0.0,
            taken_at=started,
            manifest_sha256=manifest,
            file_count=files,
            total_bytes=size,
            source="synthetic",
        ),
    )
    if kind is TaskKind.PAPER:
        repro = _reproduction(session, snap, FailureClass.MISSING_REPRODUCE_SH, content)
        _grading(session, snap, repro, 0.0, False, True, started)
    else:
        _grading(session, snap, None, 0.0, False, False, started).raw_score = raw


def _reproduction(
    session: Session, snap: Snapshot, failure: str | None, content: _Content | None
) -> Reproduction:
    # a missing reproduce.sh ends the run at once; any other run takes its 20 minutes
    ran = timedelta(seconds=2 if failure == FailureClass.MISSING_REPRODUCE_SH else 1200)
    return _add_later(
        session,
        Reproduction(
            snapshot=snap,
            status=JobStatus.SUCCEEDED,
            started_at=snap.taken_at,
            finished_at=snap.taken_at + ran,
            exit_code=1 if failure else 0,
            duration_s=ran.total_seconds(),
            failure_class=failure,
            log_sha256=None if content is None else content.log(failure),
            executed_manifest_sha256=None if content is None else snap.manifest_sha256,
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
        return _add_later(
            session,
            Grading(
                snapshot=snap,
                reproduction=repro,
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
    return _add_later(
        session,
        Grading(
            snapshot=snap,
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
    session: Session,
    snap: Snapshot,
    judge: Grading,
    score: float,
    rng: np.random.Generator,
    leaf_paths: list[str] | None = None,
) -> None:
    """Leaf grades for the judge and an expert who agrees on about 85% of leaves (on the task
    rubric's own leaves when it has one)."""
    paths = leaf_paths or [f"0.{i}" for i in range(LEAVES)]
    judged = (rng.random(LEAVES) < score).astype(float)
    expert = np.where(rng.random(LEAVES) < 0.85, judged, 1.0 - judged)
    grading = _add_later(
        session,
        Grading(
            snapshot=snap,
            kind=GradingKind.EXPERT,
            status=JobStatus.SUCCEEDED,
            score=float(expert.mean()),
            leaves_total=LEAVES,
            leaves_graded=LEAVES,
            created_at=snap.taken_at + timedelta(days=2),
        ),
    )
    for i in range(min(LEAVES, len(paths))):
        for owner, value in ((judge, judged[i]), (grading, expert[i])):
            session.add(
                LeafGrade(
                    grading=owner,
                    leaf_path=paths[i % len(paths)],
                    leaf_id=f"leaf-{i}",
                    score=float(value),
                    valid=True,
                )
            )
