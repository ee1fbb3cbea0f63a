"""Group curves and the hierarchical bootstrap: missing data, vectorised = loop.

Coverage of the group interval is tested in test_coverage.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis import stats
from analysis.bootstrap import (
    Nested,
    bootstrap_loop,
    bootstrap_means,
    draw_tasks,
    point_estimate,
    task_means,
)
from analysis.intervals import LOG_METHOD, SKEW_METHOD, task_interval
from analysis.missing import MissingReason, PointState
from analysis.synthetic import re_bench_spec, synthetic_table


def test_vectorised_bootstrap_matches_loop_in_distribution() -> None:
    rng = np.random.default_rng(3)
    values = rng.gamma(2.0, 0.2, size=(6, 5, 3))
    values[0, 4:] = np.nan  # task 0 has 4 attempts
    values[2, 1, 1] = np.nan  # one missing point
    data = Nested(values=values, counts=np.array([4, 5, 5, 5, 5, 5]))
    draws = draw_tasks(6, 4000, np.random.default_rng(1))
    fast = bootstrap_means(data, draws, np.random.default_rng(2))
    slow = bootstrap_loop(data, draws[:800], np.random.default_rng(2))
    assert fast.shape == (4000, 3)
    np.testing.assert_allclose(fast.mean(axis=0), slow.mean(axis=0), atol=0.01)
    np.testing.assert_allclose(fast.std(axis=0), slow.std(axis=0), rtol=0.12)


def test_point_estimate_weighs_tasks_equally_and_ignores_missing() -> None:
    values = np.array(
        [
            [[1.0], [1.0], [1.0], [np.nan]],
            [[0.0], [np.nan], [np.nan], [np.nan]],
        ]
    )
    data = Nested(values=values, counts=np.array([3, 2]))
    assert point_estimate(data)[0] == pytest.approx(0.5)


def test_nested_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError):
        Nested(values=np.zeros((2, 3)), counts=np.array([1, 1]))
    with pytest.raises(ValueError):
        Nested(values=np.zeros((2, 3, 1)), counts=np.array([4, 1]))


def test_group_curves_report_missing_and_never_fill_with_zero() -> None:
    spec = re_bench_spec(seed=4, p_ended_early=0.3, p_incomplete=0.1)
    study = synthetic_table(spec)
    traj = stats.trajectories(study.table, study.checkpoints)
    curves = stats.group_curves(traj)
    assert set(curves["group"]) == {"human", "iterative:model-a"}
    assert curves["n_missing"].sum() > 0
    assert (curves["n_carried"] == 0).all()
    missing = traj[traj["state"] == PointState.MISSING.value]
    assert missing["value"].isna().all()
    assert set(missing["missing"]) <= {r.value for r in MissingReason}
    # the curve mean equals the task-weighted mean of the values actually present
    last = curves[(curves["group"] == "human") & (curves["checkpoint_hours"] == 32.0)].iloc[0]
    present = traj[(traj["group"] == "human") & (traj["checkpoint_hours"] == 32.0)]
    by_task = present.groupby("task")["value"].mean()
    assert last["mean"] == pytest.approx(by_task.mean())
    assert last["lo"] < last["mean"] < last["hi"]
    assert last["method"] == (LOG_METHOD if (by_task > 0).all() else SKEW_METHOD)
    assert last["n_tasks"] == present["task"].nunique()
    assert last["n_attempts"] == present.loc[present["value"].notna(), "attempt_id"].nunique()


def test_group_curve_interval_is_the_task_interval_of_the_task_means() -> None:
    """The curve's bounds are exactly `task_interval` over the per-task means (no resampling)."""
    spec = re_bench_spec(seed=9, n_tasks=3, p_incomplete=0.1)
    traj = stats.trajectories(synthetic_table(spec).table)
    curves = stats.group_curves(traj, groups=["human"])
    hours = sorted(traj["checkpoint_hours"].unique())
    tasks = sorted(traj["task"].unique())
    data = stats.nested(traj, "human", tasks, hours)
    want = task_interval(task_means(data.values))
    np.testing.assert_allclose(curves["lo"], want.lo)
    np.testing.assert_allclose(curves["hi"], want.hi)
    assert (curves["n_tasks"] == 3).all()


def test_carry_forward_only_when_asked_and_marked() -> None:
    spec = re_bench_spec(seed=5, p_ended_early=0.5)
    study = synthetic_table(spec)
    plain = stats.trajectories(study.table, study.checkpoints)
    carried = stats.trajectories(study.table, study.checkpoints, carry_forward=True)
    ended = plain["missing"] == MissingReason.ENDED_EARLY.value
    assert ended.any() and plain.loc[ended, "value"].isna().all()
    filled = carried[carried["state"] == PointState.CARRIED_FORWARD.value]
    assert len(filled) == ended.sum()
    assert filled["value"].notna().all()
    curves = stats.group_curves(carried)
    assert curves["n_carried"].sum() == len(filled)


def _table(rows: list[dict[str, object]]) -> pd.DataFrame:
    from analysis.table import frame_from_rows

    base = {
        "task": "t",
        "task_kind": "scored",
        "group": "human",
        "participant_kind": "human",
        "attempt_id": 1,
        "missing": None,
    }
    return frame_from_rows([{**base, **row} for row in rows])


def test_best_so_far_takes_best_logged_score_by_each_checkpoint() -> None:
    table = _table(
        [
            {"source": "score_log", "working_hours": 0.5, "score": 0.4},
            {"source": "snapshot", "checkpoint_hours": 1.0, "working_hours": 1.0, "score": 0.2},
            {"source": "score_log", "working_hours": 1.5, "score": 0.9},
            {"source": "score_log", "working_hours": 1.8, "score": 0.1, "missing": "score_error"},
            {
                "source": "snapshot",
                "checkpoint_hours": 2.0,
                "working_hours": 2.0,
                "score": 0.5,
                "missing": "grading_incomplete",
            },
        ]
    )
    traj = stats.trajectories(table, [1.0, 2.0])
    assert traj["value"].tolist() == [0.4, 0.9]
    assert traj["state"].tolist() == ["best_so_far", "best_so_far"]
    snapshot_only = stats.trajectories(table, [1.0, 2.0], best_so_far=False)
    assert snapshot_only["value"].iloc[0] == 0.2
    assert math.isnan(snapshot_only["value"].iloc[1])
    assert snapshot_only["missing"].iloc[1] == "grading_incomplete"


def test_running_attempt_has_no_points_beyond_its_working_time() -> None:
    table = _table(
        [{"source": "snapshot", "checkpoint_hours": 1.0, "working_hours": 1.0, "score": 0.2}]
    )
    traj = stats.trajectories(table, [1.0, 2.0, 4.0])
    assert traj["checkpoint_hours"].tolist() == [1.0]


def test_score_vs_cost_uses_hourly_rate_and_ledger() -> None:
    spec = re_bench_spec(seed=6)
    study = synthetic_table(spec)
    traj = stats.trajectories(study.table, study.checkpoints)
    curves = stats.group_curves(traj)
    cost = stats.score_vs_cost(traj, curves, hourly_rate=100.0)
    human8 = cost[(cost["group"] == "human") & (cost["checkpoint_hours"] == 8.0)].iloc[0]
    agent8 = cost[(cost["group"] == "iterative:model-a") & (cost["checkpoint_hours"] == 8.0)]
    assert human8["cost_usd"] == pytest.approx(800.0)
    assert agent8.iloc[0]["cost_usd"] == pytest.approx(8 * 15.4)
    with pytest.raises(ValueError):
        stats.score_vs_cost(traj, curves, hourly_rate=-1)


def test_breakdowns_by_category_stage_and_failure_class() -> None:
    spec = re_bench_spec(seed=7, task_kind="paper")
    study = synthetic_table(spec)
    traj = stats.trajectories(study.table, study.checkpoints)
    cats = stats.breakdown(traj, "cat:")
    assert set(cats["name"]) == {"Code Development", "Code Execution", "Result Analysis"}
    stages = stats.breakdown(traj, "stage:")
    assert set(stages["name"]) == {"design", "implementation", "execution", "conclusion"}
    classes = stats.failure_classes(traj)
    assert "succeeded" in set(classes["failure_class"])
    for _, shares in classes.groupby("group")["share"]:
        assert shares.sum() == pytest.approx(1.0)
