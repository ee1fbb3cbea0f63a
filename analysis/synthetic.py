"""Synthetic studies with a known ground truth, for developing and testing the statistics.

Model: the score of attempt i of task j for group g at checkpoint h is

    curve_g(h) * task_j * attempt_i,
    task_j ~ LogNormal(-s_t^2/2, s_t),  attempt_i ~ LogNormal(-s_a^2/2, s_a)

so every factor has mean 1 and the population mean of group g at h is exactly curve_g(h). The
curve is linear in log-hours between its knots, so the true crossover is the same interpolation
that `analysis.stats.crossing_times` applies to the estimates. Tasks' factors are shared by all
groups (the same task is hard for everyone). Attempts may end early and gradings may be
incomplete, completely at random, so neither biases the mean of what remains.

Everything made from these data carries ``synthetic=True``; figures label it "SYNTHETIC".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, Field, model_validator

from analysis.bootstrap import Nested
from analysis.missing import MissingReason
from analysis.table import (
    SOURCE_EXPECTED,
    SOURCE_SCORE_LOG,
    SOURCE_SNAPSHOT,
    StudyData,
    frame_from_rows,
)

CATEGORIES = ("Code Development", "Code Execution", "Result Analysis")
# Category scores are these multiples of the overall score (weighted to average 1).
CATEGORY_SHAPE = (1.45, 0.8, 0.45)
STAGES = ("design", "implementation", "execution", "conclusion")
STAGE_SHAPE = (1.5, 1.2, 0.8, 0.5)
FAILURE_CLASSES = (
    "missing_reproduce_sh",  # scoring.failure.FailureClass values
    "environment",
    "script_error",
)


class GroupSpec(BaseModel):
    """One group: its true mean curve (hours -> score) and how many attempts per task."""

    name: str
    kind: str = Field(pattern="^(human|agent)$")
    knots: dict[float, float]
    attempts_per_task: int = Field(ge=1)
    scaffold: str | None = None
    model: str | None = None
    api_cost_per_hour_usd: float = Field(default=0.0, ge=0)

    def mean(self, hours: float | Sequence[float]) -> np.ndarray:
        """The true population mean at `hours`, linear in log-hours between knots."""
        xs = sorted(self.knots)
        logs = np.log(np.asarray(xs, dtype=np.float64))
        ys = np.asarray([self.knots[x] for x in xs], dtype=np.float64)
        return np.interp(np.log(np.atleast_1d(np.asarray(hours, dtype=np.float64))), logs, ys)


class SyntheticSpec(BaseModel):
    name: str = "Synthetic study"
    checkpoints: list[float]
    groups: list[GroupSpec]
    n_tasks: int = Field(ge=1)
    task_kind: str = Field(default="scored", pattern="^(scored|paper)$")
    task_sd: float = Field(default=0.35, ge=0)
    attempt_sd: float = Field(default=0.3, ge=0)
    p_ended_early: float = Field(default=0.0, ge=0, le=1)
    p_incomplete: float = Field(default=0.0, ge=0, le=1)
    human_hourly_rate_usd: float = Field(default=230.0, ge=0)
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> SyntheticSpec:
        if self.checkpoints != sorted(set(self.checkpoints)) or self.checkpoints[0] <= 0:
            raise ValueError("checkpoints must be positive and strictly increasing")
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError("group names must be unique")
        return self

    def group(self, name: str) -> GroupSpec:
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(name)

    def true_crossover(self, early: str, late: str) -> float:
        """Where `late` catches up with `early` by the true curves at the checkpoints, counted
        from the first checkpoint where they differ (as `analysis.stats.crossover` does)."""
        from analysis.stats import crossing_times

        diff = self.group(late).mean(self.checkpoints) - self.group(early).mean(self.checkpoints)
        first = int(np.argmax(diff != 0))
        return float(crossing_times(diff[first:], self.checkpoints[first:])[0])


def re_bench_spec(
    *, n_tasks: int = 7, humans: int = 4, agents: int = 6, seed: int = 0, **extra: object
) -> SyntheticSpec:
    """Shaped like RE-Bench's published result: the agent ~4x humans at 2h, parity near 8h,
    humans ~2x the agent at 32h (normalised scores, 0 = starting solution, 1 = reference)."""
    hours = [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    spec = SyntheticSpec(
        name="Synthetic RE-Bench-shaped study",
        checkpoints=hours,
        n_tasks=n_tasks,
        seed=seed,
        groups=[
            GroupSpec(
                name="human",
                kind="human",
                knots=dict(zip(hours, [0.02, 0.05, 0.10, 0.30, 0.60, 0.90, 1.20], strict=True)),
                attempts_per_task=humans,
            ),
            GroupSpec(
                name="iterative:model-a",
                kind="agent",
                scaffold="iterative",
                model="model-a",
                knots=dict(zip(hours, [0.20, 0.30, 0.40, 0.50, 0.55, 0.58, 0.60], strict=True)),
                attempts_per_task=agents,
                api_cost_per_hour_usd=15.4,  # RE-Bench: about $123 per 8-hour run
            ),
        ],
    )
    return spec.model_copy(update=dict(extra))


@dataclass
class SimAttempt:
    """One simulated attempt: its scores at the checkpoints and what went missing."""

    task: int
    group: str
    index: int  # within (task, group)
    scores: np.ndarray  # true score at each checkpoint (before missingness)
    ended_after: int  # index of the last checkpoint reached
    incomplete: list[bool]
    logs: list[tuple[float, float]] = field(default_factory=list)  # (hours, score), scored tasks
    failure_class: list[str | None] = field(default_factory=list)  # paper tasks


def simulate(spec: SyntheticSpec) -> list[SimAttempt]:
    """Draw every attempt of the study from the model (deterministic in `spec.seed`)."""
    rng = np.random.default_rng(spec.seed)
    n_check = len(spec.checkpoints)
    task_factor = _lognormal(rng, spec.task_sd, spec.n_tasks)
    out: list[SimAttempt] = []
    for task in range(spec.n_tasks):
        for group in spec.groups:
            curve = group.mean(spec.checkpoints)
            factors = _lognormal(rng, spec.attempt_sd, group.attempts_per_task)
            for index, factor in enumerate(factors):
                scores = curve * task_factor[task] * factor
                ends = rng.random() < spec.p_ended_early
                ended_after = int(rng.integers(0, n_check - 1)) if ends else n_check - 1
                attempt = SimAttempt(
                    task=task,
                    group=group.name,
                    index=index,
                    scores=scores,
                    ended_after=ended_after,
                    incomplete=list(rng.random(n_check) < spec.p_incomplete),
                )
                if spec.task_kind == "scored":
                    attempt.logs = _score_logs(rng, spec.checkpoints, scores, ended_after)
                else:
                    attempt.failure_class = [
                        _failure_class(rng, s) for s in np.minimum(scores, 1.0)
                    ]
                out.append(attempt)
    return out


def _lognormal(rng: np.random.Generator, sd: float, size: int) -> np.ndarray:
    return np.exp(rng.normal(-(sd**2) / 2, sd, size)) if sd > 0 else np.ones(size)


def _score_logs(
    rng: np.random.Generator, hours: list[float], scores: np.ndarray, ended_after: int
) -> list[tuple[float, float]]:
    """Intermediate scores between checkpoints, never above the trajectory at that time, so the
    best logged score at a checkpoint is the checkpoint's own score."""
    logs: list[tuple[float, float]] = []
    previous = 0.0
    for c in range(ended_after + 1):
        when = float(rng.uniform(previous, hours[c]))
        logs.append((when, float(scores[c] * rng.uniform(0.5, 0.95) * (when / hours[c]))))
        previous = hours[c]
    return logs


def _failure_class(rng: np.random.Generator, score: float) -> str | None:
    if rng.random() < 0.75 * (1 - score):
        return str(rng.choice(FAILURE_CLASSES))
    return None


def nested_arrays(spec: SyntheticSpec, attempts: list[SimAttempt]) -> dict[str, Nested]:
    """The simulated scores by group as tasks x attempts x checkpoints, missing as NaN."""
    out: dict[str, Nested] = {}
    n_check = len(spec.checkpoints)
    for group in spec.groups:
        values = np.full((spec.n_tasks, group.attempts_per_task, n_check), np.nan)
        for a in attempts:
            if a.group != group.name:
                continue
            row = a.scores.copy()
            row[a.ended_after + 1 :] = np.nan
            row[np.asarray(a.incomplete, dtype=bool)] = np.nan
            values[a.task, a.index] = row
        counts = np.full(spec.n_tasks, group.attempts_per_task, dtype=np.int64)
        out[group.name] = Nested(values=values, counts=counts)
    return out


def category_scores(score: float) -> dict[str, dict[str, float]]:
    """Sub-scores consistent with an overall score, in the nested shape the table reads."""
    return {
        "category": {
            c: min(1.0, score * m) for c, m in zip(CATEGORIES, CATEGORY_SHAPE, strict=True)
        },
        "stage": {s: min(1.0, score * m) for s, m in zip(STAGES, STAGE_SHAPE, strict=True)},
    }


def synthetic_table(spec: SyntheticSpec, attempts: list[SimAttempt] | None = None) -> StudyData:
    """The study as `analysis.table` would build it from the database, without a database."""
    sims = attempts if attempts is not None else simulate(spec)
    groups = {g.name: g for g in spec.groups}
    rows: list[dict[str, object]] = []
    for number, a in enumerate(sims, start=1):
        group = groups[a.group]
        human = group.kind == "human"
        base: dict[str, object] = {
            "study_id": 0,
            "study": spec.name,
            "task_id": a.task + 1,
            "task": f"synthetic-task-{a.task + 1}",
            "task_kind": spec.task_kind,
            "group": a.group,
            "participant_kind": group.kind,
            "participant_id": number,
            "participant": f"{a.group}#{a.task + 1}.{a.index + 1}",
            "attempt_id": number,
            "attempt_status": "submitted"
            if a.ended_after == len(spec.checkpoints) - 1
            else "ended",
            "attempt_limit_hours": spec.checkpoints[-1],
            "score": math.nan,
            "raw_score": math.nan,
            "synthetic": True,
        }
        for c, hours in enumerate(spec.checkpoints):
            row = dict(base)
            cost = hours * (spec.human_hourly_rate_usd if human else group.api_cost_per_hour_usd)
            if c > a.ended_after:
                row.update(
                    source=SOURCE_EXPECTED,
                    checkpoint_hours=hours,
                    working_hours=hours,
                    missing=MissingReason.ENDED_EARLY.value,
                )
                rows.append(row)
                continue
            score = _bounded(spec, float(a.scores[c]))
            failure = a.failure_class[c] if a.failure_class else None
            row.update(
                source=SOURCE_SNAPSHOT,
                snapshot_kind="checkpoint",
                checkpoint_hours=hours,
                working_hours=hours,
                wall_hours=hours * 1.4,
                score=score,
                grading_kind="script" if spec.task_kind == "scored" else "judge",
                grading_status="incomplete" if a.incomplete[c] else "succeeded",
                leaves_invalid=3.0 if a.incomplete[c] else 0.0,
                missing=MissingReason.GRADING_INCOMPLETE.value if a.incomplete[c] else None,
                api_cost_usd=0.0 if human else cost,
                human_cost_usd=cost if human else 0.0,
                cost_usd=cost,
                reproduction_status=None if spec.task_kind == "scored" else "succeeded",
                failure_class=failure,
                reproduction_failed=failure is not None,
            )
            if spec.task_kind == "paper":
                for prefix, values in category_scores(score).items():
                    short = "cat" if prefix == "category" else "stage"
                    row.update({f"{short}:{k}": v for k, v in values.items()})
            rows.append(row)
        for when, score in a.logs:
            row = dict(base)
            row.update(
                source=SOURCE_SCORE_LOG, working_hours=when, score=score, grading_kind="script"
            )
            rows.append(row)
    return StudyData(
        study_id=0,
        name=spec.name,
        checkpoints=list(spec.checkpoints),
        human_hourly_rate_usd=spec.human_hourly_rate_usd,
        table=frame_from_rows(rows),
        synthetic=True,
    )


def _bounded(spec: SyntheticSpec, score: float) -> float:
    """Paper-task scores live in [0, 1]; scored tasks may exceed 1 (better than the reference)."""
    return min(score, 1.0) if spec.task_kind == "paper" else score
