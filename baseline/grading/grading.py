"""Judge gradings of snapshots: run, resume, re-score, and the cost ledger.

A grading is a row (queued -> running -> succeeded | incomplete | failed) with one LeafGrade row
per leaf, written as leaves finish so the portal can show ``leaves_graded / leaves_total``. Every
model call (ranking and grading, failed attempts included) is a ModelCall row tied to the study,
the attempt and the grading, so costs add up at each level.

Nothing is graded twice: :class:`DbGradeCache` finds earlier valid LeafGrade rows by cache key
(and rankings by ranking key), across every grading in the database; a reused grade is recorded
with ``cached=True`` and costs nothing. Resuming an incomplete grading re-grades only its invalid
or missing leaves. Re-scoring a study with a new judge configuration creates new gradings and
keeps the earlier ones.

The judge reads a :class:`SubmissionView`; by default it is built from the snapshot store (the
executed snapshot and log of the reproduction when one is given, else the snapshot itself).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from baseline.context import Context
from baseline.errors import Conflict, InvalidInput, NotFound
from baseline.grading import claims
from baseline.grading.claims import not_queued
from baseline.models import (
    Attempt,
    Grading,
    GradingKind,
    JobStatus,
    LeafGrade,
    ModelCall,
    Reproduction,
    Snapshot,
    Task,
    TaskFile,
    TaskKind,
    utcnow,
)
from infra.blobs import BlobStore
from infra.snapshots import load_manifest
from scoring.judge import (
    CachedGrade,
    Judge,
    LeafResult,
    ReproductionRecord,
    SubmissionView,
    TaskMaterials,
)
from scoring.llm import CallRecord, JudgeConfig
from scoring.rubric import Rubric, RubricError, TaskCategory, format_path
from scoring.rubric_scores import Convention, aggregate, score_report
from scoring.rubric_scores import LeafGrade as ScoredLeaf
from scoring.stages import stage_report

log = logging.getLogger(__name__)

# PaperBench's file names inside a paper task.
RUBRIC_FILE = "rubric.json"
PAPER_FILE = "paper.md"
ADDENDUM_FILE = "addendum.md"
JUDGE_ADDENDUM_FILE = "judge.addendum.md"

PROGRESS_EVERY_S = 1.0
# What a judge grading may be run (resumed) from; a runner claims it from one of these.
RESUMABLE = (JobStatus.QUEUED, JobStatus.INCOMPLETE, JobStatus.FAILED)
_IN_CHUNK = 500

JudgeFactory = Callable[[JudgeConfig], Judge]


# --- the database grade cache -------------------------------------------------------------------


def _chunks(items: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(items), _IN_CHUNK):
        yield items[start : start + _IN_CHUNK]


class DbGradeCache:
    """Earlier valid leaf grades and rankings, found by key in every grading of the database."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def grades(self, keys: Collection[str]) -> dict[str, CachedGrade]:
        found: dict[str, CachedGrade] = {}
        for chunk in _chunks(sorted(set(keys))):
            rows = self.session.execute(
                select(LeafGrade).where(
                    LeafGrade.cache_key.in_(chunk),
                    LeafGrade.valid.is_(True),
                    LeafGrade.score.is_not(None),
                )
            ).scalars()
            for row in rows:
                if row.cache_key is None or row.score is None or row.cache_key in found:
                    continue
                found[row.cache_key] = CachedGrade(
                    score=row.score,
                    expectations=str(row.details.get("expectations", "")),
                    reality=str(row.details.get("reality", "")),
                    explanation=row.explanation,
                )
        return found

    def rankings(self, keys: Collection[str]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for chunk in _chunks(sorted(set(keys))):
            rows = self.session.execute(
                select(LeafGrade.ranking_key, LeafGrade.details).where(
                    LeafGrade.ranking_key.in_(chunk)
                )
            )
            for key, details in rows:
                ranking = details.get("ranking") if isinstance(details, dict) else None
                if key is not None and isinstance(ranking, list) and key not in found:
                    found[key] = [str(p) for p in ranking]
        return found


# --- what a grading reads -----------------------------------------------------------------------


def _task_file(session: Session, store: BlobStore, task: Task, path: str) -> bytes | None:
    row = session.scalar(select(TaskFile).where(TaskFile.task_id == task.id, TaskFile.path == path))
    return None if row is None else store.get_bytes(row.sha256)


def task_rubric_and_materials(
    session: Session, store: BlobStore, task: Task
) -> tuple[Rubric, TaskMaterials]:
    """The rubric, paper and addenda of a paper task, from the task's files."""
    if task.kind is not TaskKind.PAPER:
        raise InvalidInput(f"task {task.slug!r} is a scored task: it has no rubric to judge")
    raw_rubric = _task_file(session, store, task, RUBRIC_FILE)
    paper = _task_file(session, store, task, PAPER_FILE)
    if raw_rubric is None or paper is None:
        missing = RUBRIC_FILE if raw_rubric is None else PAPER_FILE
        raise InvalidInput(f"task {task.slug!r} has no {missing}: it cannot be judged")
    try:
        rubric = Rubric.loads(raw_rubric, source=f"{task.slug}/{RUBRIC_FILE}")
    except RubricError as exc:
        raise InvalidInput(str(exc)) from exc

    def text(path: str) -> str:
        data = _task_file(session, store, task, path)
        return "" if data is None else data.decode("utf-8", errors="replace")

    materials = TaskMaterials(
        paper=paper.decode("utf-8", errors="replace"),
        addendum=text(ADDENDUM_FILE),
        judge_addendum=text(JUDGE_ADDENDUM_FILE),
    )
    return rubric, materials


def _manifest_files(store: BlobStore, digest: str) -> dict[str, bytes]:
    manifest = load_manifest(store, digest)
    return {e.path: store.get_bytes(e.sha256) for e in manifest.files if e.sha256 is not None}


def submission_for(
    store: BlobStore, snapshot: Snapshot, reproduction: Reproduction | None
) -> SubmissionView:
    """The snapshot as the judge sees it: after reproduction (executed files, log) if there was
    one, else as captured (Code-Dev)."""
    before = _manifest_files(store, snapshot.manifest_sha256)
    if reproduction is None or reproduction.executed_manifest_sha256 is None:
        return SubmissionView(files=before)
    after = _manifest_files(store, reproduction.executed_manifest_sha256)
    log = (
        store.get_bytes(reproduction.log_sha256).decode("utf-8", errors="replace")
        if reproduction.log_sha256
        else ""
    )
    changed = frozenset(p for p, data in after.items() if before.get(p) != data)
    record = ReproductionRecord(
        log=log,
        exit_code=reproduction.exit_code,
        timed_out=reproduction.timed_out,
        changed_files=changed,
    )
    return SubmissionView(files=after, reproduction=record)


# --- creating and running gradings --------------------------------------------------------------


def _leaves_to_grade(rubric: Rubric, code_dev: bool) -> int:
    return sum(
        1
        for _, node in rubric.leaves()
        if not code_dev or node.task_category is TaskCategory.CODE_DEVELOPMENT
    )


def create_judge_grading(
    session: Session,
    snapshot: Snapshot,
    config: JudgeConfig,
    rubric: Rubric,
    *,
    code_dev: bool = False,
    reproduction: Reproduction | None = None,
) -> Grading:
    """A queued judge grading of `snapshot` (Code-Dev: no reproduction is needed or used)."""
    if reproduction is not None and reproduction.snapshot_id != snapshot.id:
        raise InvalidInput(
            f"reproduction {reproduction.id} is of snapshot {reproduction.snapshot_id}, "
            f"not {snapshot.id}"
        )
    grading = Grading(
        snapshot_id=snapshot.id,
        reproduction_id=None if code_dev or reproduction is None else reproduction.id,
        kind=GradingKind.JUDGE,
        status=JobStatus.QUEUED,
        config={"judge": config.model_dump(mode="json"), "code_dev": code_dev},
        config_hash=config.config_hash(),
        leaves_total=_leaves_to_grade(rubric, code_dev),
    )
    session.add(grading)
    session.flush()
    return grading


@dataclass
class GradingOutcome:
    grading_id: int
    status: JobStatus
    score: float | None
    leaves_total: int
    leaves_graded: int
    leaves_invalid: int
    leaves_cached: int
    model_calls: int
    cost_usd: float


def judge_call_row(call: CallRecord, study_id: int, attempt_id: int, grading_id: int) -> ModelCall:
    """The ledger row of one judge call (every attempt of a retried call is its own row)."""
    return ModelCall(
        study_id=study_id,
        attempt_id=attempt_id,
        grading_id=grading_id,
        purpose=f"judge_{call.purpose}"[:32],  # the column's width
        model=call.model,
        prompt_tokens=call.prompt_tokens,
        completion_tokens=call.completion_tokens,
        cost_usd=call.cost_usd,
    )


def grading_cost(session: Session, grading_id: int) -> float:
    """What a grading's model calls cost so far, from the ledger."""
    total = session.scalar(
        select(func.coalesce(func.sum(ModelCall.cost_usd), 0.0)).where(
            ModelCall.grading_id == grading_id
        )
    )
    return float(total or 0.0)


@dataclass
class _Writer:
    """Writes leaf grades and ledger rows as they arrive, committing at most once a second."""

    ctx: Context
    grading_id: int
    study_id: int
    attempt_id: int
    session: Session
    existing: dict[str, LeafGrade]
    calls: int = 0
    cached: int = 0
    cost: float = 0.0
    _last_commit: float = field(default_factory=time.monotonic)

    def leaf(self, result: LeafResult) -> None:
        row = self.existing.get(result.path)
        if row is None:
            row = LeafGrade(grading_id=self.grading_id, leaf_path=result.path)
            self.session.add(row)
            self.existing[result.path] = row
        row.leaf_id = result.leaf_id
        row.score = result.score
        row.valid = result.valid
        row.explanation = result.explanation
        row.error = result.error
        row.cache_key = result.cache_key
        row.ranking_key = result.ranking_key
        row.cached = result.cached
        row.details = result.details()
        self.cached += int(result.cached)
        self._progress()

    def call(self, call: CallRecord, leaf: str | None) -> None:
        self.session.add(judge_call_row(call, self.study_id, self.attempt_id, self.grading_id))
        self.calls += 1
        self.cost += call.cost_usd

    def _progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_commit < PROGRESS_EVERY_S:
            return
        grading = self.session.get(Grading, self.grading_id)
        assert grading is not None
        rows = self.existing.values()
        grading.leaves_graded = sum(1 for r in rows if r.valid)
        grading.leaves_invalid = sum(1 for r in rows if not r.valid)
        self.session.commit()
        self._last_commit = now

    def flush(self) -> None:
        self._progress(force=True)


def run_judge_grading(
    ctx: Context,
    grading_id: int,
    *,
    submission: SubmissionView | None = None,
    rubric: Rubric | None = None,
    materials: TaskMaterials | None = None,
    judge_factory: JudgeFactory = Judge,
    store: BlobStore | None = None,
) -> GradingOutcome:
    """Run (or resume) a judge grading: only leaves without a valid grade are graded.

    `submission`, `rubric` and `materials` default to what the snapshot store and the task hold.
    The runner claims the grading first (`claims.claim`): one another runner holds raises
    `claims.NotQueued`, so no leaf is paid twice; its result is written only under its claim.
    A run given up by its heartbeat (`claims.Heartbeat`) asks for no more leaves once the next
    one is written, keeps the leaves it paid for where the database takes them, and raises
    `claims.ClaimLost`. The judge's client is closed however the run ends.
    """
    store = store or BlobStore(ctx.settings.blob_dir)
    with ctx.session() as session:
        grading = session.get(Grading, grading_id)
        if grading is None:
            raise NotFound(f"no grading {grading_id}")
        if grading.kind is not GradingKind.JUDGE:
            raise Conflict(f"grading {grading_id} is a {grading.kind.value} grading, not a judge's")
        if grading.status is JobStatus.RUNNING:
            raise not_queued(grading)
        if grading.status is JobStatus.SUCCEEDED:
            raise Conflict(f"grading {grading_id} is complete: nothing to resume")
        snapshot = grading.snapshot
        attempt = session.get(Attempt, snapshot.attempt_id)
        assert attempt is not None
        if rubric is None or materials is None:
            task_rubric, task_materials = task_rubric_and_materials(session, store, attempt.task)
            rubric = rubric or task_rubric
            materials = materials or task_materials
        code_dev = bool(grading.config.get("code_dev"))
        config = JudgeConfig.model_validate(grading.config["judge"])
        if submission is None:
            reproduction = (
                session.get(Reproduction, grading.reproduction_id)
                if grading.reproduction_id is not None
                else None
            )
            submission = submission_for(store, snapshot, reproduction)
        study_id, attempt_id = attempt.study_id, attempt.id
        leaves_total = _leaves_to_grade(rubric, code_dev)
    claim = claims.claim(
        ctx, Grading, grading_id, start_from=RESUMABLE, error=None, leaves_total=leaves_total
    )

    with claims.Heartbeat(ctx, Grading, grading_id, claim) as heartbeat, ctx.session() as session:
        existing = {
            row.leaf_path: row
            for row in session.scalars(select(LeafGrade).where(LeafGrade.grading_id == grading_id))
        }
        done = {path for path, row in existing.items() if row.valid}
        todo = [
            format_path(path)
            for path, node in rubric.leaves()
            if format_path(path) not in done
            and (not code_dev or node.task_category is TaskCategory.CODE_DEVELOPMENT)
        ]
        writer = _Writer(ctx, grading_id, study_id, attempt_id, session, existing)

        def on_leaf(result: LeafResult) -> None:
            writer.leaf(result)
            heartbeat.check()  # given up: no more leaves asked for

        judge = judge_factory(config)
        try:
            judge.grade(
                rubric,
                materials,
                submission,
                code_dev=code_dev,
                only=todo,
                cache=DbGradeCache(session),
                on_leaf=on_leaf,
                on_call=writer.call,
            )
        except claims.ClaimLost:
            keep_paid(session, grading_id, "leaves")
            raise
        except Exception as exc:
            session.rollback()
            _fail(ctx, grading_id, claim, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            judge.client.close()
        writer.flush()
        grades = {
            path: ScoredLeaf(score=row.score, valid=row.valid, explanation=row.explanation)
            for path, row in existing.items()
        }
        keep = (lambda n: n.task_category is TaskCategory.CODE_DEVELOPMENT) if code_dev else None
        tree = aggregate(rubric, grades, Convention.STRICT, keep=keep)
        variant = rubric.code_dev() if code_dev else rubric
        report = score_report(variant, _remap(rubric, grades, code_dev))
        session.commit()  # the leaves written, whatever becomes of the claim
        grading = claims.claimed(session, Grading, grading_id, claim)
        if grading is None:  # taken over: the run that followed writes its own result
            taken = session.get(Grading, grading_id)
            assert taken is not None
            return _outcome(taken, writer)
        grading.status = JobStatus.SUCCEEDED if tree.missing == 0 else JobStatus.INCOMPLETE
        grading.score = tree.score
        grading.raw_score = tree.root.lower
        # The shape analysis.table.sub_scores reads: overall numbers plus nested sections.
        grading.category_scores = {
            **report.to_obj(),
            "stages": stage_report(variant, _remap(rubric, grades, code_dev)).stages,
        }
        grading.cost_usd = grading_cost(session, grading_id)
        grading.finished_at = utcnow()
        if tree.missing:
            grading.error = f"{tree.missing} leaves invalid or ungraded: resume to re-grade them"
        return _outcome(grading, writer)


def _outcome(grading: Grading, writer: _Writer) -> GradingOutcome:
    """What a run did: the grading's row as it ends, and this runner's calls and cost."""
    return GradingOutcome(
        grading_id=grading.id,
        status=grading.status,
        score=grading.score,
        leaves_total=grading.leaves_total,
        leaves_graded=grading.leaves_graded,
        leaves_invalid=grading.leaves_invalid,
        leaves_cached=writer.cached,
        model_calls=writer.calls,
        cost_usd=writer.cost,
    )


def _remap(rubric: Rubric, grades: dict[str, ScoredLeaf], code_dev: bool) -> dict[str, ScoredLeaf]:
    """Grades keyed by the paths of the rubric variant the report is made on."""
    if not code_dev:
        return grades
    variant = rubric.code_dev()
    remapped: dict[str, ScoredLeaf] = {}
    for path, _ in variant.leaves():
        original = format_path(variant.source_path(path))
        if original in grades:
            remapped[format_path(path)] = grades[original]
    return remapped


def keep_paid(session: Session, grading_id: int, what: str) -> None:
    """What a given-up run paid for (`what`: its leaves, its model calls), committed if the
    database takes it now (the next run then need not pay for it again), as a run's end commits
    it whatever became of its claim; the row's status is left to recovery."""
    try:
        session.commit()
    except Exception:
        session.rollback()
        log.warning("grading %s: the %s of the run given up were not recorded", grading_id, what)


def _fail(ctx: Context, grading_id: int, claim: datetime, error: str) -> None:
    """The judge raised: failed, unless the claim was taken over meanwhile."""
    with ctx.session() as session:
        grading = claims.claimed(session, Grading, grading_id, claim)
        if grading is not None:
            grading.status = JobStatus.FAILED
            grading.error = error[:2000]
            grading.finished_at = utcnow()


# --- re-scoring and costs -----------------------------------------------------------------------


def rescore_study(
    ctx: Context,
    study_id: int,
    config: JudgeConfig,
    *,
    code_dev: bool = False,
    store: BlobStore | None = None,
) -> list[int]:
    """Queue a new judge grading of every snapshot of the study's paper-task attempts.

    Earlier gradings are kept. Each new grading uses the latest succeeded reproduction of its
    snapshot (none in Code-Dev mode). Returns the new gradings' ids, to run with
    :func:`run_judge_grading` (by the scheduler or at once).
    """
    store = store or BlobStore(ctx.settings.blob_dir)
    created: list[int] = []
    with ctx.session() as session:
        attempts = session.scalars(select(Attempt).where(Attempt.study_id == study_id)).all()
        rubrics: dict[int, Rubric] = {}
        for attempt in attempts:
            if attempt.task.kind is not TaskKind.PAPER:
                continue
            if attempt.task_id not in rubrics:
                task_rubric, _ = task_rubric_and_materials(session, store, attempt.task)
                rubrics[attempt.task_id] = task_rubric
            for snapshot in attempt.snapshots:
                reproduction = None
                if not code_dev:
                    reproduction = session.scalar(
                        select(Reproduction)
                        .where(
                            Reproduction.snapshot_id == snapshot.id,
                            Reproduction.status == JobStatus.SUCCEEDED,
                        )
                        .order_by(Reproduction.id.desc())
                        .limit(1)
                    )
                grading = create_judge_grading(
                    session,
                    snapshot,
                    config,
                    rubrics[attempt.task_id],
                    code_dev=code_dev,
                    reproduction=reproduction,
                )
                created.append(grading.id)
    return created


@dataclass(frozen=True)
class CostSummary:
    calls: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    by_purpose: dict[str, float]


def cost_summary(
    session: Session,
    *,
    study_id: int | None = None,
    attempt_id: int | None = None,
    grading_id: int | None = None,
) -> CostSummary:
    """The ledger summed over a study, an attempt or a grading (exactly one must be given)."""
    given = [(ModelCall.study_id, study_id), (ModelCall.attempt_id, attempt_id)]
    given.append((ModelCall.grading_id, grading_id))
    chosen = [(column, value) for column, value in given if value is not None]
    if len(chosen) != 1:
        raise InvalidInput("give exactly one of study_id, attempt_id, grading_id")
    column, value = chosen[0]
    rows = session.execute(
        select(
            ModelCall.purpose,
            func.count(),
            func.coalesce(func.sum(ModelCall.prompt_tokens), 0),
            func.coalesce(func.sum(ModelCall.completion_tokens), 0),
            func.coalesce(func.sum(ModelCall.cost_usd), 0.0),
        )
        .where(column == value)
        .group_by(ModelCall.purpose)
    ).all()
    return CostSummary(
        calls=sum(int(r[1]) for r in rows),
        prompt_tokens=sum(int(r[2]) for r in rows),
        completion_tokens=sum(int(r[3]) for r in rows),
        cost_usd=sum(float(r[4]) for r in rows),
        by_purpose={str(r[0]): float(r[4]) for r in rows},
    )
