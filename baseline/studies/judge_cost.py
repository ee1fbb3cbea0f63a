"""An estimate of what a study's judge will cost, with every input shown, so a coordinator can
weigh a judge model before the bills arrive.

The judge grades every leaf of a paper task's rubric (Code-Dev: its Code Development leaves) at
every snapshot of every attempt (`baseline.jobs.orchestration.discover`): start, each checkpoint
within the working-time limit, each interval snapshot, and the final one. Tokens per leaf are
measured from the cost ledger (`ModelCall`, ranking calls included) where the judge has graded
before, in this study or with the same model elsewhere; until then they are the most a leaf's
call may use (the judge fills its context with files up to the budget), labelled as such.
EXP-Bench tasks are graded by stages, not leaves, and are left out, which the estimate says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from baseline.models import (
    Attempt,
    Grading,
    GradingKind,
    ModelCall,
    Study,
    StudyTask,
    Task,
    TaskKind,
)
from scoring.llm import JudgeConfig
from scoring.rubric import TaskCategory


@dataclass(frozen=True)
class TaskCost:
    slug: str
    leaves: int
    attempts: int
    usd_per_attempt: float

    @property
    def usd(self) -> float:
        return self.usd_per_attempt * self.attempts


@dataclass(frozen=True)
class JudgeCostEstimate:
    model: str
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    snapshots_per_attempt: int
    prompt_tokens_per_leaf: float
    completion_tokens_per_leaf: float
    tokens_from: str  # where the tokens per leaf come from, in words
    measured: bool
    tasks: list[TaskCost]
    left_out: list[str]  # paper-like tasks the estimate does not cover, with why

    @property
    def usd_per_leaf(self) -> float:
        return (
            self.prompt_tokens_per_leaf * self.input_usd_per_mtok
            + self.completion_tokens_per_leaf * self.output_usd_per_mtok
        ) / 1_000_000

    @property
    def usd(self) -> float:
        return sum(t.usd for t in self.tasks)


def snapshots_per_attempt(study: Study) -> int:
    """The snapshots an attempt that works to its limit gets: start, checkpoints within the
    limit, interval snapshots, final."""
    limit_h = study.working_time_limit_hours
    checkpoints = sum(1 for h in study.checkpoint_hours if h <= limit_h)
    intervals = 0
    if study.snapshot_interval_minutes:
        intervals = math.floor(limit_h * 60 / study.snapshot_interval_minutes)
    return 1 + checkpoints + intervals + 1


def estimate(
    session: Session, study: Study, config: JudgeConfig, code_dev: bool
) -> JudgeCostEstimate:
    price = config.resolved_price
    prompt, completion, source, measured = _tokens_per_leaf(session, study, config)
    per_attempt = snapshots_per_attempt(study)
    costs: list[TaskCost] = []
    left_out: list[str] = []
    tasks = session.scalars(
        select(Task).join(StudyTask).where(StudyTask.study_id == study.id).order_by(Task.slug)
    )
    for task in tasks:
        if task.kind is TaskKind.EXPBENCH:
            left_out.append(f"{task.slug} (EXP-Bench: graded by stages, not leaves)")
            continue
        if task.kind is not TaskKind.PAPER:
            continue
        leaves = _leaves(task, code_dev)
        attempts = session.scalar(
            select(func.count())
            .select_from(Attempt)
            .where(Attempt.study_id == study.id, Attempt.task_id == task.id)
        )
        leaf_usd = (prompt * price.input_usd_per_mtok + completion * price.output_usd_per_mtok) / (
            1_000_000
        )
        costs.append(
            TaskCost(task.slug, leaves, int(attempts or 0), leaves * per_attempt * leaf_usd)
        )
    return JudgeCostEstimate(
        model=config.model,
        input_usd_per_mtok=price.input_usd_per_mtok,
        output_usd_per_mtok=price.output_usd_per_mtok,
        snapshots_per_attempt=per_attempt,
        prompt_tokens_per_leaf=prompt,
        completion_tokens_per_leaf=completion,
        tokens_from=source,
        measured=measured,
        tasks=costs,
        left_out=left_out,
    )


def _leaves(task: Task, code_dev: bool) -> int:
    """The leaves the judge grades: all, or in Code-Dev the Code Development ones (a rubric
    without any is graded as its root alone, `scoring.rubric`)."""
    summary = task.summary or {}
    if code_dev:
        by_category = summary.get("leaves_by_category") or {}
        return int(by_category.get(TaskCategory.CODE_DEVELOPMENT.value, 0)) or 1
    return int(summary.get("leaves") or 0)


def _tokens_per_leaf(
    session: Session, study: Study, config: JudgeConfig
) -> tuple[float, float, str, bool]:
    """Prompt and completion tokens per graded leaf, and where they come from."""
    judge_calls = ModelCall.purpose.like("judge_%")
    for where, label in (
        (ModelCall.study_id == study.id, "this study's"),
        (ModelCall.model == config.model, f"{config.model}'s"),
    ):
        prompt, completion, gradings = session.execute(
            select(
                func.coalesce(func.sum(ModelCall.prompt_tokens), 0),
                func.coalesce(func.sum(ModelCall.completion_tokens), 0),
                func.count(func.distinct(ModelCall.grading_id)),
            ).where(judge_calls, where)
        ).one()
        ids = select(ModelCall.grading_id).where(judge_calls, where).distinct()
        leaves = session.scalar(
            select(func.coalesce(func.sum(Grading.leaves_graded), 0)).where(
                Grading.id.in_(ids), Grading.kind == GradingKind.JUDGE
            )
        )
        if leaves:
            return (
                int(prompt) / int(leaves),
                int(completion) / int(leaves),
                f"measured: {label} judge calls, {int(leaves)} leaves in {int(gradings)} gradings "
                "(ranking calls included)",
                True,
            )
    full = float(config.context_tokens - config.max_output_tokens)
    ranking = full / config.rank_batch_size if config.rank_always else 0.0
    return (
        full + ranking,
        float(config.max_output_tokens),
        "at most: no judge call measured yet, so each leaf is counted with a full context "
        f"({config.context_tokens:,} tokens, {config.max_output_tokens:,} of them output)"
        + (
            f" plus its share of a ranking call (one per {config.rank_batch_size} leaves)"
            if ranking
            else ""
        ),
        False,
    )
