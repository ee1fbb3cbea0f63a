"""The study planner: its recommended sizes reach the promised power, and bad plans are refused."""

from __future__ import annotations

import math

import pytest

from analysis import planner
from analysis.planner import CheckpointGuess, PlanError, PlanSpec
from analysis.synthetic import re_bench_spec, synthetic_table

CHECK_STUDIES = 4000


def _spec(**changes: object) -> PlanSpec:
    values: dict[str, object] = {
        "checkpoints": [
            CheckpointGuess(hours=2, mean_a=0.10, mean_b=0.18),
            CheckpointGuess(hours=8, mean_a=0.40, mean_b=0.30),
        ],
        "task_sd": 1.0,
        "attempt_sd": 0.6,
        "attempts_a": 1,
        "attempts_b": 3,
        "zero_share_a": 0.2,
        "studies": 2000,
    }
    values.update(changes)
    return PlanSpec.model_validate(values)


@pytest.mark.parametrize("shape", ["bounded", "positive"])
def test_studies_of_the_recommended_size_reach_the_promised_power(shape: str) -> None:
    """Re-simulated with fresh random numbers at each checkpoint's recommended size, the power
    is at least the target, within the Monte Carlo error of both simulations (3 s.e. each: the
    size is the first on the grid whose estimate reached the target)."""
    spec = _spec(shape=shape)
    if shape == "positive":  # normalised scores: noisier, so larger gaps (and no cap at 1)
        gaps = [
            CheckpointGuess(hours=2, mean_a=0.1, mean_b=0.2),
            CheckpointGuess(hours=8, mean_a=1.2, mean_b=0.7),
        ]
        spec = _spec(shape=shape, task_sd=0.4, checkpoints=gaps)
    result = planner.plan(spec)
    assert all(c.tasks_needed is not None for c in result.checkpoints)
    rechecked = planner.check(result, studies=CHECK_STUDIES)
    se_plan = math.sqrt(spec.power * (1 - spec.power) / spec.studies)
    se_check = math.sqrt(spec.power * (1 - spec.power) / CHECK_STUDIES)
    for checkpoint, power in zip(result.checkpoints, rechecked, strict=True):
        assert power >= spec.power - 3 * (se_plan + se_check), (checkpoint, power)
        assert checkpoint.power_at_needed is not None
        assert abs(power - checkpoint.power_at_needed) <= 3 * math.hypot(se_plan, se_check)
    # One task fewer than recommended does not reach the target (the size is the smallest).
    for checkpoint in result.checkpoints:
        below = [p for n, p in checkpoint.power_curve if n < (checkpoint.tasks_needed or 0)]
        assert all(p < spec.power for p in below)


def test_a_bigger_gap_and_more_runs_need_fewer_tasks() -> None:
    small = planner.plan(_spec(checkpoints=[CheckpointGuess(hours=4, mean_a=0.3, mean_b=0.36)]))
    big = planner.plan(_spec(checkpoints=[CheckpointGuess(hours=4, mean_a=0.3, mean_b=0.5)]))
    assert (big.tasks_needed or 0) < (small.tasks_needed or 10**6)
    one_run = planner.plan(
        _spec(checkpoints=[CheckpointGuess(hours=4, mean_a=0.3, mean_b=0.4)], attempts_b=1)
    )
    many = planner.plan(
        _spec(checkpoints=[CheckpointGuess(hours=4, mean_a=0.3, mean_b=0.4)], attempts_b=8)
    )
    assert (many.tasks_needed or 0) <= (one_run.tasks_needed or 10**6)


def test_the_budget_counts_people_runs_and_money() -> None:
    spec = _spec(
        attempts_a=2,
        attempts_b=4,
        tasks_per_human=3,
        limit_hours=8,
        costs=planner.Costs(
            human_hourly_usd=50,
            gpu_hourly_usd=2,
            gpus_per_workspace=1,
            judge_usd_per_snapshot=3,
            agent_usd_per_attempt=10,
        ),
    )
    budget = planner.budget(spec, 10)
    assert (budget.human_attempts, budget.human_participants, budget.agent_runs) == (20, 7, 40)
    assert budget.human_pay_usd == 20 * 8 * 50
    assert budget.gpu_hours == 60 * 8 and budget.gpu_usd == 60 * 8 * 2
    assert budget.judge_usd == 60 * 3 * 3  # 2 checkpoints and the start snapshot
    assert budget.agent_usd == 400
    parts = budget.human_pay_usd + budget.gpu_usd + budget.judge_usd + budget.agent_usd
    assert budget.total_usd == parts


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"power": 1.0}, "power must lie strictly between 0 and 1"),
        ({"power": 0.0}, "power must lie strictly between 0 and 1"),
        (
            {"checkpoints": [CheckpointGuess(hours=2, mean_a=0.2, mean_b=0.2)]},
            "a gap of 0 cannot be detected",
        ),
        ({"checkpoints": [CheckpointGuess(hours=2, mean_a=0.2, mean_b=1.3)]}, "not a bounded"),
        ({"zero_share_b": 0.9}, "needs the other attempts above 1"),
        ({"checkpoints": []}, "at least 1"),
    ],
)
def test_bad_plans_get_a_clear_error(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _spec(**changes)


def test_the_portal_refuses_a_plan_too_costly_to_simulate() -> None:
    spec = _spec(studies=20_000, attempts_a=20, attempts_b=20)
    with pytest.raises(PlanError, match="over the portal's"):
        planner.plan(spec, max_scores=planner.PORTAL_MAX_SCORES)


def test_a_pilot_gives_the_guesses_and_one_task_is_refused() -> None:
    study = synthetic_table(re_bench_spec(seed=5, task_kind="paper"))
    spec = planner.from_pilot(study, "human", "iterative:model-a", studies=500)
    assert spec.shape == "bounded" and spec.group_b == "iterative:model-a"
    assert spec.task_sd > 0 and spec.attempt_sd > 0 and len(spec.checkpoints) >= 3
    assert spec.attempts_b > spec.attempts_a  # the agents ran more often per task
    result = planner.plan(spec.model_copy(update={"max_tasks": 20}))
    assert len(result.checkpoints) == len(spec.checkpoints)
    one = study.table[study.table["task"] == study.table["task"].iloc[0]]
    narrowed = type(study)(**{**study.__dict__, "table": one.reset_index(drop=True)})
    with pytest.raises(PlanError, match="at least 2 are needed to measure how much tasks differ"):
        planner.from_pilot(narrowed, "human", "iterative:model-a")
    with pytest.raises(PlanError, match="no scores of group 'ghost'"):
        planner.from_pilot(study, "human", "ghost")
