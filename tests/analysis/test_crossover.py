"""Crossover: found where it is known, and RE-Bench-shaped data put it between 2 and 32 hours."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis import stats
from analysis.synthetic import re_bench_spec, synthetic_table

AGENT = "iterative:model-a"


def test_crossing_times_interpolates_in_log_hours() -> None:
    hours = [1.0, 4.0, 16.0]
    d = np.array([[-1.0, 1.0, 2.0], [1.0, 2.0, 3.0], [-1.0, -1.0, -1.0], [-3.0, -1.0, 1.0]])
    got = stats.crossing_times(d, hours)
    assert got[0] == pytest.approx(2.0)  # halfway between 1 and 4 in log-hours
    assert got[1] == -math.inf
    assert got[2] == math.inf
    assert got[3] == pytest.approx(8.0)


def _two_groups(crossing_at: float) -> pd.DataFrame:
    """Noise-free curves that cross exactly at `crossing_at` hours, on 4 tasks."""
    rows = []
    attempt = 0
    for task in range(4):
        for group, slope in (("a", 0.0), ("b", 1.0)):
            for _ in range(3):
                attempt += 1
                for h in (1.0, 2.0, 4.0, 8.0, 16.0):
                    value = 0.5 + slope * 0.1 * math.log2(h / crossing_at)
                    rows.append(
                        {
                            "task": f"t{task}",
                            "group": group,
                            "attempt_id": attempt,
                            "checkpoint_hours": h,
                            "value": value,
                            "state": "observed",
                        }
                    )
    return pd.DataFrame(rows)


def test_crossover_found_on_synthetic_data_with_known_crossing() -> None:
    result = stats.crossover(_two_groups(5.0), "b", "a", n_boot=300)
    assert result.early_leader == "a" and result.late_leader == "b"
    assert result.estimate_hours == pytest.approx(5.0)
    assert result.p_crossing == 1.0


def test_re_bench_shaped_study_crosses_between_2_and_32_hours() -> None:
    spec = re_bench_spec(seed=11)
    truth = spec.true_crossover(AGENT, "human")
    assert 4.0 < truth < 8.0
    study = synthetic_table(spec)
    traj = stats.trajectories(study.table, study.checkpoints)
    result = stats.crossover(traj, "human", AGENT, n_boot=2000)
    assert result.early_leader == AGENT and result.late_leader == "human"
    assert result.estimate_hours is not None and 2.0 < result.estimate_hours < 32.0
    assert result.ci_low_hours <= truth <= result.ci_high_hours
    assert result.ci_low_hours > 2.0 and result.ci_high_hours < 32.0
    assert result.first_separated_hours is not None and result.first_separated_hours > truth


def test_crossover_interval_contains_truth_in_most_studies() -> None:
    """Not one lucky seed: over 60 RE-Bench-shaped studies the interval holds the truth >= 90%."""
    hits = 0
    for seed in range(60):
        spec = re_bench_spec(seed=1000 + seed, p_ended_early=0.1)
        study = synthetic_table(spec)
        traj = stats.trajectories(study.table, study.checkpoints)
        result = stats.crossover(traj, "human", AGENT, n_boot=500, seed=seed)
        truth = spec.true_crossover(AGENT, "human")
        hits += result.ci_low_hours <= truth <= result.ci_high_hours
    assert hits / 60 >= 0.9


def test_no_crossing_is_reported_as_none_with_open_interval() -> None:
    spec = re_bench_spec(seed=3)
    human = spec.group("human")
    flat = human.model_copy(update={"knots": {h: 0.01 for h in spec.checkpoints}})
    spec = spec.model_copy(update={"groups": [flat, spec.group(AGENT)]})
    study = synthetic_table(spec)
    traj = stats.trajectories(study.table, study.checkpoints)
    result = stats.crossover(traj, "human", AGENT, n_boot=300)
    assert result.estimate_hours is None
    assert result.ci_high_hours == math.inf
    assert result.first_separated_hours is None


def test_unknown_group_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no trajectories for group 'ghost'"):
        stats.crossover(_two_groups(4.0), "a", "ghost")
