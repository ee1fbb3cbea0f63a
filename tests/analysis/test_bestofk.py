"""Best-of-k: the order-statistics formula against brute-force enumeration and resampling."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import stats
from analysis.synthetic import re_bench_spec, synthetic_table


def brute_force(scores: list[float], k: int, replace: bool) -> float:
    if replace:
        draws = list(itertools.product(scores, repeat=k))
    else:
        draws = list(itertools.combinations(scores, k))
    return sum(max(d) for d in draws) / len(draws)


@pytest.mark.parametrize("replace", [True, False])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_exact_matches_enumeration_on_small_cases(k: int, replace: bool) -> None:
    scores = [0.1, 0.7, 0.3, 0.3, 0.95]
    assert stats.expected_max_exact(scores, k, replace=replace) == pytest.approx(
        brute_force(scores, k, replace)
    )


@settings(max_examples=60, deadline=None)
@given(
    scores=st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=6),
    k=st.integers(1, 4),
    replace=st.booleans(),
)
def test_exact_matches_enumeration_on_random_cases(
    scores: list[float], k: int, replace: bool
) -> None:
    if not replace and k > len(scores):
        assert np.isnan(stats.expected_max_exact(scores, k, replace=False))
        return
    assert stats.expected_max_exact(scores, k, replace=replace) == pytest.approx(
        brute_force(scores, k, replace), abs=1e-9
    )


@pytest.mark.parametrize("replace", [True, False])
def test_resampling_agrees_with_exact(replace: bool) -> None:
    scores = list(np.random.default_rng(0).gamma(2, 0.3, 9))
    exact = stats.expected_max_exact(scores, 3, replace=replace)
    sampled = stats.expected_max_resampled(scores, 3, n_resamples=200_000, replace=replace)
    assert sampled == pytest.approx(exact, rel=0.01)


def test_best_of_one_is_the_mean_and_k_increases_it() -> None:
    scores = [0.2, 0.4, 0.9]
    assert stats.expected_max_exact(scores, 1) == pytest.approx(0.5)
    assert stats.expected_max_exact(scores, 2) > 0.5
    with pytest.raises(ValueError):
        stats.expected_max_exact(scores, 0)


def test_best_of_k_curve_budget_is_k_times_run_length() -> None:
    study = synthetic_table(re_bench_spec(seed=2))
    traj = stats.trajectories(study.table, study.checkpoints)
    curve = stats.best_of_k(traj, [1, 4], groups=["iterative:model-a"])
    one = curve[(curve["k"] == 1) & (curve["run_hours"] == 8.0)].iloc[0]
    four = curve[(curve["k"] == 4) & (curve["run_hours"] == 8.0)].iloc[0]
    assert four["budget_hours"] == 32.0
    assert four["expected_max"] > one["expected_max"]
    mean_of_tasks = (
        traj[(traj["group"] == "iterative:model-a") & (traj["checkpoint_hours"] == 8.0)]
        .groupby("task")["value"]
        .mean()
        .mean()
    )
    assert one["expected_max"] == pytest.approx(mean_of_tasks)
