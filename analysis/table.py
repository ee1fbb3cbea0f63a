"""The tidy results table: one row per measurement of one attempt, built from the database.

A measurement is a snapshot (with the grading chosen for it), an intermediate score log of a
scored task, or an *expected* checkpoint the attempt never reached (ended early). Missing values
are never zero: the ``missing`` column names why a score is absent or not usable
(`analysis.missing.MissingReason`), and ``score`` stays NaN or keeps the partial value it had.
A participant's failure is not missing: a submission that failed its scoring stands at the
task's floor (score 0) and ``floor`` names the failure (`scoring.scoring_run.floor_reason`).

Sub-scores from ``Grading.category_scores`` become ``cat:<name>`` and ``stage:<name>`` columns;
``judge`` names the judge of a judge grading (model and settings hash), so gradings of one study
by different judges are told apart.
Accepted shapes: ``{"Code Development": 0.4, ...}`` (flat: categories), or nested
``{"category": {...}, "finegrained": {...}, "stage": {...}}`` (plural keys too); a value may be a
number or ``{"score": number, ...}``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session

from analysis.missing import MissingReason, grading_missing_reason
from baseline.grading.reproductions import reproduction_status
from baseline.models import (
    Attempt,
    AttemptStatus,
    Grading,
    GradingKind,
    JobStatus,
    ModelCall,
    Participant,
    Reproduction,
    ScoreLog,
    Snapshot,
    SnapshotKind,
    Study,
    StudyTask,
    Task,
    TaskKind,
)

COLUMNS: tuple[str, ...] = (
    "study_id",
    "study",
    "task_id",
    "task",
    "task_kind",
    "group",
    "participant_kind",
    "participant_id",
    "participant",
    "attempt_id",
    "attempt_status",
    "attempt_limit_hours",
    "source",
    "snapshot_id",
    "snapshot_kind",
    "checkpoint_hours",
    "working_hours",
    "wall_hours",
    "measured_at",
    "score",
    "raw_score",
    "grading_kind",
    "judge",
    "grading_status",
    "leaves_total",
    "leaves_graded",
    "leaves_invalid",
    "reproduction_status",
    "failure_class",
    "reproduction_failed",
    "api_cost_usd",
    "grading_cost_usd",
    "human_cost_usd",
    "cost_usd",
    "floor",
    "missing",
    "synthetic",
)

SOURCE_SNAPSHOT = "snapshot"
SOURCE_SCORE_LOG = "score_log"
SOURCE_EXPECTED = "expected"
TERMINAL = frozenset(
    {
        AttemptStatus.SUBMITTED,
        AttemptStatus.ENDED,
        AttemptStatus.FAILED,
        AttemptStatus.DISQUALIFIED,
    }
)
_NESTED_KEYS = {
    "category": "cat",
    "categories": "cat",
    "finegrained": "cat",
    "finegrained_category": "cat",
    "finegrained_categories": "cat",
    "stage": "stage",
    "stages": "stage",
}


@dataclass
class StudyData:
    """What a notebook works with: the table plus the study settings the methods need."""

    study_id: int
    name: str
    checkpoints: list[float]
    human_hourly_rate_usd: float
    table: pd.DataFrame
    synthetic: bool = False
    agreement: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def groups(self) -> list[str]:
        return sorted(self.table["group"].dropna().unique().tolist())

    @property
    def tasks(self) -> list[str]:
        return sorted(self.table["task"].dropna().unique().tolist())


def sub_scores(category_scores: Mapping[str, Any] | None) -> dict[str, float]:
    """Flatten a grading's category scores into ``cat:``/``stage:`` columns.

    Only the nested sections count: a grading's report also carries its overall numbers
    (``score``, ``lower``, ``upper``, leaf counts) at the top level, which are not sub-scores.
    """
    out: dict[str, float] = {}
    for key, value in (category_scores or {}).items():
        prefix = _NESTED_KEYS.get(str(key).lower())
        if prefix is None or not isinstance(value, Mapping):
            continue
        for name, inner in value.items():
            number = _number(inner)
            if number is not None:
                out[f"{prefix}:{name}"] = number
    return out


def judge_label(grading: Grading) -> str | None:
    """Which judge made a judge grading: its model and the first characters of its settings'
    hash (a study re-scored with another judge has both in its table), None for other kinds."""
    judge = (grading.config or {}).get("judge")
    if grading.kind is not GradingKind.JUDGE or not isinstance(judge, Mapping):
        return None
    return f"{judge.get('model')} {grading.config_hash[:8]}"


def _number(value: Any) -> float | None:
    if isinstance(value, Mapping):
        value = value.get("score")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _hours(seconds: float | None) -> float:
    return math.nan if seconds is None else seconds / 3600.0


def _epoch(at: datetime | None) -> float:
    """When a measurement was taken, in seconds since the epoch (NaN: unknown): the order in
    which tasks enter a confidence sequence (`analysis.sequential`)."""
    return math.nan if at is None else at.timestamp()


def _wall_hours(attempt: Attempt, at: datetime | None) -> float:
    if attempt.started_at is None or at is None:
        return math.nan
    return (at - attempt.started_at).total_seconds() / 3600.0


def _latest(rows: Iterable[Any]) -> Any | None:
    return max(rows, key=lambda r: r.id, default=None)


def choose_grading(gradings: list[Grading], kind: GradingKind) -> Grading | None:
    """The latest succeeded grading of that kind, else the latest of any status (shown as such)."""
    of_kind = [g for g in gradings if g.kind is kind]
    done = [g for g in of_kind if g.status is JobStatus.SUCCEEDED]
    return _latest(done) or _latest(of_kind)


class _Costs:
    """Cumulative agent API cost per attempt, from the ModelCall ledger (grading calls excluded)."""

    def __init__(self, session: Session, attempt_ids: list[int]) -> None:
        # Three columns, not ledger rows: an agent makes thousands of calls, and loading each
        # as an ORM object was most of the time the analysis page took to read a study.
        calls = session.execute(
            select(ModelCall.attempt_id, ModelCall.created_at, ModelCall.cost_usd).where(
                ModelCall.attempt_id.in_(attempt_ids), ModelCall.grading_id.is_(None)
            )
        )
        self._calls: dict[int, list[tuple[datetime, float]]] = defaultdict(list)
        for attempt_id, created_at, cost_usd in calls:
            if attempt_id is not None:
                self._calls[attempt_id].append((created_at, cost_usd))
        for rows in self._calls.values():
            rows.sort(key=lambda r: r[0])

    def until(self, attempt_id: int, at: datetime | None) -> float:
        rows = self._calls.get(attempt_id, [])
        if at is None:
            return sum(cost for _, cost in rows)
        return sum(cost for when, cost in rows if when <= at)


def build_table(session: Session, study: Study, hourly_rate: float | None = None) -> pd.DataFrame:
    """Every measurement of every attempt of the study, as a tidy DataFrame (COLUMNS + sub-scores).

    `hourly_rate` overrides the study's human hourly rate for ``human_cost_usd``.
    """
    rate = study.human_hourly_rate_usd if hourly_rate is None else hourly_rate
    if not math.isfinite(rate) or rate < 0:
        raise ValueError(f"hourly rate must be a number >= 0, got {rate!r}")
    attempts = list(
        session.scalars(select(Attempt).where(Attempt.study_id == study.id).order_by(Attempt.id))
    )
    attempt_ids = [a.id for a in attempts]
    synthetic_tasks = {
        t.id
        for t in session.scalars(select(Task).join(StudyTask).where(StudyTask.study_id == study.id))
        if (t.summary or {}).get("synthetic")
    }
    snapshots = list(session.scalars(select(Snapshot).where(Snapshot.attempt_id.in_(attempt_ids))))
    snapshot_ids = [s.id for s in snapshots]
    gradings: dict[int, list[Grading]] = defaultdict(list)
    for found in session.scalars(select(Grading).where(Grading.snapshot_id.in_(snapshot_ids))):
        gradings[found.snapshot_id].append(found)
    reproductions: dict[int, list[Reproduction]] = defaultdict(list)
    for job in session.scalars(
        select(Reproduction).where(Reproduction.snapshot_id.in_(snapshot_ids))
    ):
        reproductions[job.snapshot_id].append(job)
    logs: dict[int, list[ScoreLog]] = defaultdict(list)
    for log in session.scalars(select(ScoreLog).where(ScoreLog.attempt_id.in_(attempt_ids))):
        logs[log.attempt_id].append(log)
    costs = _Costs(session, attempt_ids)
    by_attempt: dict[int, list[Snapshot]] = defaultdict(list)
    for snap in snapshots:
        by_attempt[snap.attempt_id].append(snap)

    rows: list[dict[str, Any]] = []
    for attempt in attempts:
        base = _attempt_columns(study, attempt, attempt.task_id in synthetic_tasks)
        human = attempt.participant.kind.value == "human"
        grading_kind = (
            GradingKind.SCRIPT if attempt.task.kind is TaskKind.SCORED else GradingKind.JUDGE
        )
        seen_checkpoints: set[float] = set()
        for snap in sorted(by_attempt[attempt.id], key=lambda s: (s.taken_working_s, s.id)):
            row = dict(base)
            checkpoint = _checkpoint_of(snap)
            if checkpoint is not None:
                seen_checkpoints.add(round(checkpoint, 6))
            repro = _latest(reproductions[snap.id])
            grading = choose_grading(gradings[snap.id], grading_kind)
            row.update(
                source=SOURCE_SNAPSHOT,
                snapshot_id=snap.id,
                snapshot_kind=snap.kind.value,
                checkpoint_hours=math.nan if checkpoint is None else checkpoint,
                working_hours=_hours(snap.taken_working_s),
                wall_hours=_wall_hours(attempt, snap.taken_at),
                measured_at=_epoch(snap.taken_at),
                reproduction_status=None if repro is None else reproduction_status(repro),
                failure_class=None if repro is None else repro.failure_class,
                reproduction_failed=_reproduction_failed(repro),
                missing=grading_missing_reason(grading, repro),
            )
            if grading is not None:
                row.update(
                    score=math.nan if grading.score is None else grading.score,
                    raw_score=math.nan if grading.raw_score is None else grading.raw_score,
                    grading_kind=grading.kind.value,
                    judge=judge_label(grading),
                    grading_status=grading.status.value,
                    leaves_total=grading.leaves_total,
                    leaves_graded=grading.leaves_graded,
                    leaves_invalid=grading.leaves_invalid,
                    grading_cost_usd=grading.cost_usd,
                    floor=grading.floor_reason,
                    **sub_scores(grading.category_scores),
                )
            # The final snapshot's row is the run's whole cost: the call that crossed the limit
            # (in flight when the limit's final snapshot was taken) was paid for this attempt.
            until = None if snap.kind is SnapshotKind.FINAL else snap.taken_at
            _add_cost(row, human, rate, costs.until(attempt.id, until))
            rows.append(row)
        for log in logs[attempt.id]:
            row = dict(base)
            row.update(
                source=SOURCE_SCORE_LOG,
                working_hours=_hours(log.working_s),
                wall_hours=_wall_hours(attempt, log.created_at),
                measured_at=_epoch(log.created_at),
                score=math.nan if log.normalised_score is None else log.normalised_score,
                raw_score=math.nan if log.raw_score is None else log.raw_score,
                grading_kind=GradingKind.SCRIPT.value,
                floor=log.floor_reason,
                missing=_score_log_missing(log),
            )
            _add_cost(row, human, rate, costs.until(attempt.id, log.created_at))
            rows.append(row)
        if attempt.status in TERMINAL:
            for hours in study.checkpoint_hours:
                due = float(hours)
                if due * 3600.0 > attempt.working_time_limit_s + 1e-6:
                    continue
                if round(due, 6) in seen_checkpoints:
                    continue
                row = dict(base)
                row.update(
                    source=SOURCE_EXPECTED,
                    checkpoint_hours=due,
                    working_hours=due,
                    missing=MissingReason.ENDED_EARLY.value,
                )
                rows.append(row)
    return frame_from_rows(rows)


def _score_log_missing(log: ScoreLog) -> str | None:
    """Why an intermediate score has no score: still being scored (as a grading that runs), or
    its scoring reported an error (one interrupted included); None when it has one."""
    if log.status is JobStatus.RUNNING:
        return MissingReason.NOT_GRADED.value
    return MissingReason.SCORE_ERROR.value if log.normalised_score is None else None


def frame_from_rows(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = None
    extra = sorted(c for c in frame.columns if c not in COLUMNS)
    frame = frame[list(COLUMNS) + extra]
    numeric = [
        "checkpoint_hours",
        "working_hours",
        "wall_hours",
        "measured_at",
        "score",
        "raw_score",
        "attempt_limit_hours",
        "api_cost_usd",
        "grading_cost_usd",
        "human_cost_usd",
        "cost_usd",
        "leaves_total",
        "leaves_graded",
        "leaves_invalid",
        *extra,
    ]
    for column in numeric:
        frame[column] = pd.to_numeric(frame[column], errors="raise").astype("float64")
    frame["reproduction_failed"] = frame["reproduction_failed"].fillna(False).astype(bool)
    frame["synthetic"] = frame["synthetic"].fillna(False).astype(bool)
    return frame.reset_index(drop=True)


def empty_table() -> pd.DataFrame:
    return frame_from_rows([])


def _attempt_columns(study: Study, attempt: Attempt, synthetic: bool) -> dict[str, Any]:
    participant: Participant = attempt.participant
    return {
        "study_id": study.id,
        "study": study.name,
        "task_id": attempt.task_id,
        "task": attempt.task.slug,
        "task_kind": attempt.task.kind.value,
        "group": participant.group,
        "participant_kind": participant.kind.value,
        "participant_id": participant.id,
        "participant": participant.pseudonym,
        "attempt_id": attempt.id,
        "attempt_status": attempt.status.value,
        "attempt_limit_hours": attempt.working_time_limit_s / 3600.0,
        "score": math.nan,
        "raw_score": math.nan,
        "synthetic": synthetic,
    }


def _checkpoint_of(snap: Snapshot) -> float | None:
    if snap.kind is SnapshotKind.CHECKPOINT:
        return snap.due_working_s / 3600.0
    if snap.kind is SnapshotKind.START:
        return 0.0
    return None


def _reproduction_failed(repro: Reproduction | None) -> bool:
    if repro is None:
        return False
    if repro.status is JobStatus.FAILED or repro.timed_out:
        return True
    return repro.exit_code not in (None, 0)


def _add_cost(row: dict[str, Any], human: bool, rate: float, api_cost: float) -> None:
    hours = row["working_hours"]
    row["api_cost_usd"] = api_cost
    row["human_cost_usd"] = hours * rate if human else 0.0
    row["cost_usd"] = row["human_cost_usd"] if human else api_cost


def agreement_table(session: Session, study: Study) -> pd.DataFrame:
    """Judge against expert, per snapshot graded by both: scores and leaf-level agreement."""
    # Only the snapshots an expert graded (few, where any): reading every snapshot's gradings of
    # a large study again took a fifth of the analysis page's reading of it.
    expert_graded = (
        select(Grading.snapshot_id)
        .join(Snapshot, Snapshot.id == Grading.snapshot_id)
        .join(Attempt, Attempt.id == Snapshot.attempt_id)
        .where(Attempt.study_id == study.id, Grading.kind == GradingKind.EXPERT)
    )
    snaps = list(
        session.scalars(
            select(Snapshot).where(Snapshot.id.in_(expert_graded)).order_by(Snapshot.id)
        )
    )
    by_snap: dict[int, list[Grading]] = defaultdict(list)
    for grading in session.scalars(
        select(Grading).where(Grading.snapshot_id.in_([s.id for s in snaps]))
    ):
        by_snap[grading.snapshot_id].append(grading)
    rows: list[dict[str, Any]] = []
    for snap in snaps:
        judge = choose_grading(by_snap[snap.id], GradingKind.JUDGE)
        expert = choose_grading(by_snap[snap.id], GradingKind.EXPERT)
        if judge is None or expert is None:
            continue
        attempt = snap.attempt
        judged = {leaf.leaf_path: leaf for leaf in judge.leaves if leaf.valid}
        pairs = [
            (judged[leaf.leaf_path].score, leaf.score)
            for leaf in expert.leaves
            if leaf.valid and leaf.leaf_path in judged
        ]
        agree = sum(1 for a, b in pairs if a == b)
        rows.append(
            {
                "snapshot_id": snap.id,
                "task": attempt.task.slug,
                "group": attempt.participant.group,
                "judge_score": math.nan if judge.score is None else judge.score,
                "expert_score": math.nan if expert.score is None else expert.score,
                "leaves_compared": len(pairs),
                "leaf_agreement": agree / len(pairs) if pairs else math.nan,
            }
        )
    columns = [
        "snapshot_id",
        "task",
        "group",
        "judge_score",
        "expert_score",
        "leaves_compared",
        "leaf_agreement",
    ]
    return pd.DataFrame(rows, columns=columns)


def load_from_session(
    session: Session, study: Study, hourly_rate: float | None = None
) -> StudyData:
    table = build_table(session, study, hourly_rate)
    return StudyData(
        study_id=study.id,
        name=study.name,
        checkpoints=[float(h) for h in study.checkpoint_hours],
        human_hourly_rate_usd=study.human_hourly_rate_usd if hourly_rate is None else hourly_rate,
        table=table,
        synthetic=bool(table["synthetic"].any()) if len(table) else False,
        agreement=agreement_table(session, study),
    )
