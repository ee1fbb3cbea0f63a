"""Anytime-valid intervals: a study looked at every day keeps its 95%.

Each simulated study has 20 tasks arriving one a day (a task's value: one attempt's score in
[0, 1]); the coordinator looks after every arrival. The confidence sequence must exclude the true
mean on *some* day in at most 5% of studies (within the binomial tolerance of STUDIES studies);
the fixed-n interval looked at the same way does not hold its level, which is why the live
dashboard shows the sequence.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from analysis import report, stats
from analysis.intervals import task_interval
from analysis.sequential import CS_METHOD, betting_cs, first_values
from analysis.synthetic import re_bench_spec, synthetic_table

STUDIES = 1000
DAYS = 20
NOMINAL = 0.95
SHAPES = ("beta(0.5, 3)", "beta(2, 2)", "zero-inflated")
# One-sided: the sequence may be conservative; it must not miss more than 5% beyond the z of a
# 1% family-wise error over the shapes.
TOLERANCE = float(scipy_stats.norm.ppf(1 - 0.01 / len(SHAPES))) * math.sqrt(
    NOMINAL * (1 - NOMINAL) / STUDIES
)


def _draw(shape: str, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    if shape == "beta(0.5, 3)":
        return rng.beta(0.5, 3.0, (STUDIES, DAYS)), 0.5 / 3.5
    if shape == "beta(2, 2)":
        return rng.beta(2.0, 2.0, (STUDIES, DAYS)), 0.5
    zero = rng.random((STUDIES, DAYS)) < 0.7  # 70% of tasks exactly 0, the rest high
    return np.where(zero, 0.0, rng.beta(5.0, 2.0, (STUDIES, DAYS))), 0.3 * 5 / 7


@pytest.mark.parametrize("shape", SHAPES)
def test_the_confidence_sequence_holds_under_daily_peeking(shape: str) -> None:
    values, truth = _draw(shape, np.random.default_rng(SHAPES.index(shape)))
    lo, hi = betting_cs(values)
    ever_missed = ((lo > truth) | (hi < truth)).any(axis=1).mean()
    assert ever_missed <= 1 - NOMINAL + TOLERANCE, ever_missed

    # The fixed-n interval, looked at after every task from the third on, misses on some day
    # far more often than 5%.
    fixed_missed = np.zeros(STUDIES, dtype=bool)
    for day in range(3, DAYS + 1):
        got = task_interval(values[:, :day, None], bounds=(0.0, 1.0))
        low, high = got.lo[:, 0], got.hi[:, 0]
        fixed_missed |= ~np.isnan(low) & ((low > truth) | (high < truth))
    assert fixed_missed.mean() > 1 - NOMINAL + TOLERANCE, fixed_missed.mean()


def test_the_sequence_only_narrows_and_stays_in_range() -> None:
    values = np.random.default_rng(3).beta(2.0, 5.0, (50, DAYS))
    lo, hi = betting_cs(values)
    assert (np.diff(lo, axis=1) >= 0).all() and (np.diff(hi, axis=1) <= 0).all()
    assert (lo >= 0).all() and (hi <= 1).all() and (lo <= hi).all()
    assert (hi[:, -1] - lo[:, -1] < hi[:, 2] - lo[:, 2]).all()


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="values in \\[0, 1\\]"):
        betting_cs(np.array([0.5, 1.5]))
    with pytest.raises(ValueError, match="no NaN"):
        betting_cs(np.array([0.5, np.nan]))
    with pytest.raises(ValueError, match="level"):
        betting_cs(np.array([0.5]), level=1.0)


def test_each_task_enters_once_with_its_first_measured_attempt() -> None:
    times = np.array([[5.0, 2.0], [np.nan, np.nan], [1.0, np.nan], [3.0, 4.0]])
    values = np.array([[0.9, 0.2], [0.5, 0.5], [0.7, np.nan], [0.1, 0.3]])
    got, when = first_values(times, values)
    assert got.tolist() == [0.7, 0.2, 0.1] and when.tolist() == [1.0, 2.0, 3.0]


def _bounded_traj() -> pd.DataFrame:
    study = synthetic_table(re_bench_spec(seed=4, task_kind="paper"))
    return stats.trajectories(study.table, study.checkpoints)


def test_live_curves_use_the_sequence_on_bounded_scores_only() -> None:
    traj = _bounded_traj()
    fixed = stats.group_curves(traj)
    live = stats.group_curves(traj, anytime=True)
    assert set(fixed["interval"]) == {"fixed"} and set(live["interval"]) == {"anytime"}
    assert set(live["method"]) == {CS_METHOD}
    shown = live["lo"].notna()
    assert (
        (live["hi"] - live["lo"])[shown] >= (fixed["hi"] - fixed["lo"])[shown] - 1e-9
    ).mean() > 0.9
    scored = synthetic_table(re_bench_spec(seed=4))
    scored_traj = stats.trajectories(scored.table, scored.checkpoints)
    unbounded = stats.group_curves(scored_traj, anytime=True)
    assert set(unbounded["interval"]) == {"fixed"}
    assert unbounded["method"].str.contains("anytime-valid needs scores in a known range").all()


def test_a_live_study_shows_the_sequence_and_an_ended_one_the_fixed_intervals() -> None:
    study = synthetic_table(re_bench_spec(seed=4, task_kind="paper"))
    ended = study.table.copy()
    ended["attempt_status"] = "submitted"
    done = type(study)(**{**study.__dict__, "table": ended})
    assert not report.analyse(done, report.Filters(n_boot=100)).anytime
    running = ended.copy()
    running.loc[running.index[0], "attempt_status"] = "running"
    live = report.analyse(
        type(study)(**{**study.__dict__, "table": running}), report.Filters(n_boot=100)
    )
    assert live.anytime and set(live.curves["interval"]) == {"anytime"}
    caption = report.figures(live, ("trajectories",))["trajectories"].layout.annotations[0].text
    caption = caption.replace("<br>", " ")  # captions are wrapped into lines
    assert "anytime-valid" in caption and "hold for one look only" in caption
    asked = report.analyse(done, report.Filters(n_boot=100, intervals="anytime"))
    assert asked.anytime


def test_a_live_study_with_unbounded_scores_says_why_it_has_no_sequence() -> None:
    study = synthetic_table(re_bench_spec(seed=4))  # scored tasks: normalised, unbounded
    running = study.table.copy()
    running["attempt_status"] = "running"
    live = report.analyse(
        type(study)(**{**study.__dict__, "table": running}), report.Filters(n_boot=100)
    )
    assert not live.anytime and set(live.curves["interval"]) == {"fixed"}
    assert any("Anytime-valid intervals need scores in a known range" in n for n in live.notes)
