"""Coverage of the group interval, per checkpoint, with skewed scores, at 2, 3, 5 and 10 tasks.

Each case simulates STUDIES studies at once (vectorised numpy, seeded; about a second each).
Scores are lognormal products of a task effect, a task-by-checkpoint effect, an attempt effect
and an attempt-by-checkpoint effect (all of mean 1), tasks have 2 to 4 attempts, so the
population mean at each checkpoint is known exactly and the checkpoints are not copies of one
another: each has its own noise, and each is checked on its own. The task spreads checked against
95% run from mild (sd 0.10 on the log scale) to RE-Bench-like (0.35, task means of one group
differing by a factor of about 2); heavy skew (0.80) is held to its documented, lower value.

Tolerance: the observed coverage of S studies has binomial standard error
SE = sqrt(0.95 * 0.05 / S), 0.0024 at S = 8,000. There are CHECKS = 3 spreads x 3 task counts x
7 checkpoints single checks; the tolerance is the z of a 1% family-wise error by the union bound,
z = Phi^-1(1 - 0.01 / (2 CHECKS)) = 3.78, times SE (0.0092), so an exactly-95% method fails this
file with probability below 1% (and the seeds are fixed). The mean over the 7 checkpoints of a
case must in addition lie within 3 SE of 0.95 (its own SE is at most SE: the checkpoints of a
study are positively correlated, never more variable than one). The method is not exactly 95%
(0.947 at 3 RE-Bench-like tasks with 40,000 studies): over 8 other seeds, 1 of the 72 cases
left the tolerance (by 0.0007), so a changed seed can fail without the method having changed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from analysis.bootstrap import FloatArray
from analysis.intervals import (
    BINARY_METHOD,
    EDGE_BOUND,
    END_LOG_METHOD,
    LEFT_SKEWED_LOGS,
    LOG_METHOD,
    MAX_MOVER_CORRELATION,
    MAX_MOVER_STRETCH,
    MIN_TASKS,
    MOVER_LOG_METHOD,
    MOVER_T_METHOD,
    PLAIN_METHOD,
    SKEW_METHOD,
    TIED,
    WILSON_METHOD,
    WILSON_MIN_TASKS,
    paired_interval,
    task_interval,
)
from tests.analysis.score_shapes import PAIRS, SHAPES, UNIT, Pair, Shape
from tests.analysis.score_shapes import TASKS as SHAPE_TASKS

STUDIES = 8000
NOMINAL = 0.95
SPREADS = (0.1, 0.25, 0.35)  # task sd on the log scale held to 95%
TASK_COUNTS = (3, 5, 10)
CURVE = np.array([0.02, 0.05, 0.10, 0.30, 0.60, 0.90, 1.20])  # RE-Bench-shaped human means
CHECKS = len(SPREADS) * len(TASK_COUNTS) * len(CURVE)
SE = math.sqrt(NOMINAL * (1 - NOMINAL) / STUDIES)
TOLERANCE = float(stats.norm.ppf(1 - 0.01 / (2 * CHECKS))) * SE
# Heavy skew (task sd 0.80): coverage measured with 40,000 studies (other seeds), documented in
# `analysis.intervals`; held to it within the same z on the difference of two estimates.
HEAVY_DOCUMENTED = {3: 0.951, 5: 0.951, 10: 0.949}
HEAVY_TOLERANCE = TOLERANCE * math.sqrt(1 + STUDIES / 40_000)


def _lognormal(rng: np.random.Generator, sd: float, shape: tuple[int, ...]) -> FloatArray:
    return np.exp(rng.normal(-(sd**2) / 2, sd, shape))


def simulate_task_means(
    n_tasks: int,
    *,
    task_sd: float,
    attempt_sd: float = 0.3,
    checkpoint_sd: float = 0.2,
    attempts: int = 4,
    seed: int = 0,
) -> FloatArray:
    """Task means of STUDIES studies, [studies, tasks, checkpoints]; attempts 1..`attempts`."""
    rng = np.random.default_rng(seed)
    shape = (STUDIES, n_tasks, attempts, len(CURVE))
    scores = (
        CURVE
        * _lognormal(rng, task_sd, (STUDIES, n_tasks, 1, 1))
        * _lognormal(rng, checkpoint_sd / 2, (STUDIES, n_tasks, 1, len(CURVE)))
        * _lognormal(rng, attempt_sd, (STUDIES, n_tasks, attempts, 1))
        * _lognormal(rng, checkpoint_sd, shape)
    )
    # tasks have 2 to `attempts` attempts: unequal sizes, as in real studies
    counts = rng.integers(2, attempts + 1, size=(STUDIES, n_tasks))
    scores[np.arange(attempts)[None, None, :] >= counts[..., None]] = np.nan
    return np.nanmean(scores, axis=2)


def coverage(lo: FloatArray, hi: FloatArray) -> FloatArray:
    return np.mean((lo <= CURVE) & (hi >= CURVE), axis=0)


@pytest.mark.parametrize("task_sd", SPREADS)
@pytest.mark.parametrize("n_tasks", TASK_COUNTS)
def test_coverage_per_checkpoint_is_95_within_binomial_tolerance(
    n_tasks: int, task_sd: float
) -> None:
    """Acceptance: every checkpoint's coverage within TOLERANCE of 0.95 at 3, 5 and 10 tasks."""
    means = simulate_task_means(n_tasks, task_sd=task_sd, seed=1000 * n_tasks + int(100 * task_sd))
    got = task_interval(means)
    assert got.lo.shape == (STUDIES, len(CURVE))
    assert np.all(got.n_tasks == n_tasks)
    cover = coverage(got.lo, got.hi)
    assert np.all(np.abs(cover - NOMINAL) <= TOLERANCE), (n_tasks, task_sd, cover, TOLERANCE)
    assert abs(cover.mean() - NOMINAL) <= 3 * SE, (n_tasks, task_sd, cover.mean())


@pytest.mark.parametrize("n_tasks", TASK_COUNTS)
def test_heavy_skew_coverage_matches_documented(n_tasks: int) -> None:
    """Task means differing by factors of 5 or more: at 95% (0.949-0.951), as documented; the
    Cox interval used before (0.937-0.945, 40,000 studies) fails the tolerance here at 3 tasks."""
    means = simulate_task_means(n_tasks, task_sd=0.8, seed=7000 + n_tasks)
    got = task_interval(means)
    cover = coverage(got.lo, got.hi)
    expected = HEAVY_DOCUMENTED[n_tasks]
    assert np.all(np.abs(cover - expected) <= HEAVY_TOLERANCE), (n_tasks, cover, expected)


def test_log_normal_interval_is_calibrated_to_the_t_on_logs_that_barely_spread() -> None:
    """The profile-likelihood interval's cut-off n log(1 + t^2 / (n - 1)) is the one that makes
    the likelihood-ratio rule the t-interval on a normal mean: where the logs barely spread (the
    mean's sigma^2 / 2 offset negligible) the bounds are the exponentiated t-interval of the logs;
    where they spread widely the interval reaches further up than down (a log-normal mean)."""
    logs = np.array([0.1, 0.1005, 0.0998, 0.1002])
    got = task_interval(np.exp(logs)[:, None])
    assert got.methods()[0] == LOG_METHOD
    half = stats.t.ppf(0.975, 3) * logs.std(ddof=1) / 2
    np.testing.assert_allclose(
        [got.lo[0], got.hi[0]], np.exp([logs.mean() - half, logs.mean() + half]), rtol=1e-6
    )
    spread = task_interval(np.array([[0.3], [1.0], [3.0]]))
    assert spread.hi[0] - spread.mean[0] > 2 * (spread.mean[0] - spread.lo[0])


def _plain_t(means: FloatArray) -> tuple[FloatArray, FloatArray]:
    n = means.shape[1]
    half = stats.t.ppf(0.975, n - 1) * means.std(axis=1, ddof=1) / math.sqrt(n)
    centre = means.mean(axis=1)
    return centre - half, centre + half


@pytest.mark.parametrize("n_tasks", TASK_COUNTS)
def test_plain_t_misses_where_the_log_scale_interval_holds(n_tasks: int) -> None:
    """Why not the plain t-interval: on RE-Bench-like skew it covers 0.93, out of tolerance."""
    means = simulate_task_means(n_tasks, task_sd=0.35, seed=100 + n_tasks)
    plain = coverage(*_plain_t(means))
    assert np.all(plain < NOMINAL - TOLERANCE), plain
    got = task_interval(means)
    assert np.all(np.abs(coverage(got.lo, got.hi) - NOMINAL) <= TOLERANCE)


def test_two_tasks_give_no_interval() -> None:
    """The documented behaviour at 2 tasks: the mean, and no interval (NaN bounds).

    Why: the interval that 2 tasks allow (t on 1 degree of freedom, 12.7 standard errors each
    side) covers well under 95% once task means are skewed, so a "95%" label would mislead."""
    assert MIN_TASKS == 3
    means = simulate_task_means(2, task_sd=0.8, seed=7)
    got = task_interval(means)
    assert np.all(np.isnan(got.lo)) and np.all(np.isnan(got.hi))
    np.testing.assert_allclose(got.mean, means.mean(axis=1))
    assert np.all(got.n_tasks == 2)
    plain = coverage(*_plain_t(means))
    assert np.all(plain < NOMINAL - TOLERANCE), plain


PROGRESS = special.logit(np.array([0.03, 0.06, 0.12, 0.25, 0.40, 0.55, 0.65]))
RUBRIC_SD = {"task x checkpoint": 0.3, "attempt": 0.5, "attempt x checkpoint": 0.3}


def simulate_rubric(n_tasks: int, *, task_sd: float, seed: int) -> tuple[FloatArray, FloatArray]:
    """PaperBench-like rubric fractions in [0, 1], logistic in a checkpoint's progress minus a
    task's difficulty plus noise: task means [studies, tasks, checkpoints] and the true means
    (by Gauss-Hermite quadrature over the one normal the logit is)."""
    rng = np.random.default_rng(seed)
    attempts, k = 4, len(PROGRESS)
    logit = (
        PROGRESS
        - rng.normal(0, task_sd, (STUDIES, n_tasks, 1, 1))
        + rng.normal(0, RUBRIC_SD["task x checkpoint"], (STUDIES, n_tasks, 1, k))
        + rng.normal(0, RUBRIC_SD["attempt"], (STUDIES, n_tasks, attempts, 1))
        + rng.normal(0, RUBRIC_SD["attempt x checkpoint"], (STUDIES, n_tasks, attempts, k))
    )
    scores = special.expit(logit)
    counts = rng.integers(2, attempts + 1, size=(STUDIES, n_tasks))
    scores[np.arange(attempts)[None, None, :] >= counts[..., None]] = np.nan
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    sd = math.sqrt(task_sd**2 + sum(v**2 for v in RUBRIC_SD.values()))
    truth = special.expit(PROGRESS[:, None] + sd * nodes) @ weights / weights.sum()
    return np.nanmean(scores, axis=2), truth


@pytest.mark.parametrize("n_tasks", [3, 5])
def test_bounded_rubric_scores_stay_near_95_where_the_t_interval_falls_short(n_tasks: int) -> None:
    """Rubric fractions with their known range [0, 1]: documented in `analysis.intervals` at
    0.937-0.969 per checkpoint with task sd 1.0 (the plain t falls to 0.85). Held inside the
    target [0.93, 0.975] at every checkpoint (within the binomial tolerance), and closer to 95%
    on average than the skew-corrected t alone."""
    means, truth = simulate_rubric(n_tasks, task_sd=1.0, seed=300 + n_tasks)
    got = task_interval(means, bounds=UNIT)
    assert (got.methods() == END_LOG_METHOD).any()  # the log scale near an end is what serves here
    cover = np.mean((got.lo <= truth) & (truth <= got.hi), axis=0)
    assert np.all((cover >= 0.93 - TOLERANCE) & (cover <= 0.975 + TOLERANCE)), cover
    t_only = task_interval(means, log_scale=False, bounds=UNIT)
    hall = np.mean((t_only.lo <= truth) & (truth <= t_only.hi), axis=0)
    assert np.abs(cover - NOMINAL).mean() < np.abs(hall - NOMINAL).mean(), (cover, hall)


# Coverage of the shapes in `score_shapes` as documented in `analysis.intervals` (20,000 studies
# per cell, benchmarks/coverage_shapes.py). Cells inside the target [0.93, 0.975] are held to it;
# the others, where the method is known to miss it, to their documented value, so that a change
# for the worse fails here.
SHAPE_DOCUMENTED = {
    "zero-inflated bimodal": (0.974, 0.991, 0.948, 0.964, 0.952),
    "beta(0.5, 3)": (0.952, 0.963, 0.935, 0.956, 0.954),
    "beta(2, 2)": (0.961, 0.963, 0.959, 0.961, 0.955),
    "lognormal sd 0.8": (0.950, 0.949, 0.952, 0.953, 0.949),
    "lognormal sd 1.2": (0.940, 0.941, 0.950, 0.950, 0.949),
    "beta tasks, beta attempts x1": (0.955, 0.961, 0.955, 0.963, 0.959),
    "beta tasks, beta attempts x4": (0.969, 0.969, 0.953, 0.957, 0.954),
    "beta tasks, beta attempts x8": (0.967, 0.966, 0.954, 0.958, 0.954),
    "zero-heavy ties": (0.994, 0.999, 0.998, 0.963, 0.946),
    "bimodal 0/1 attempts x1": (0.972, 0.971, 0.962, 0.946, 0.945),
    "bimodal 0/1 attempts x4": (0.985, 0.913, 0.930, 0.943, 0.948),
    "bimodal 0/1 attempts x8": (0.903, 0.903, 0.930, 0.939, 0.948),
}
# Paired differences (the second table there): coverage, and the median width over the plain t
# on the differences, per number of tasks.
PAIR_DOCUMENTED = {
    "zero-inflated 60% vs 40% zeros": (
        (0.952, 0.961, 0.933, 0.948, 0.948),
        (0.55, 0.9, 1.0, 1.0, 1.0),
    ),
    "beta(0.5, 3) vs beta(1, 3)": (
        (0.945, 0.942, 0.942, 0.942, 0.946),
        (1.11, 1.04, 1.02, 1.01, 1.0),
    ),
    "beta(2, 2) vs beta(2, 2)": ((0.955, 0.952, 0.949, 0.95, 0.95), (1.1, 1.03, 1.01, 1.0, 1.0)),
    "lognormal 0.8 vs 0.8": ((0.978, 0.973, 0.972, 0.966, 0.967), (2.3, 2.09, 1.71, 1.4, 1.24)),
    "lognormal 1.2 vs 0.5": ((0.933, 0.931, 0.942, 0.95, 0.957), (1.98, 1.92, 1.89, 1.63, 1.37)),
}
SHAPE_STUDIES = 4000
SHAPE_CHECKS = (len(SHAPE_DOCUMENTED) + len(PAIR_DOCUMENTED)) * len(SHAPE_TASKS)
SHAPE_Z = float(stats.norm.ppf(1 - 0.01 / (2 * SHAPE_CHECKS)))  # 1% family-wise, union bound
T_VALID_WIDTH = 1.1  # where the plain t holds, the interval may be at most this much wider


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape.name)
def test_coverage_on_the_score_shapes_studies_produce(shape: Shape) -> None:
    """Issue 37: each shape at 3-40 tasks covers inside [0.93, 0.975] or at its documented
    value, never with a zero-width interval; and where the plain t is valid (covers inside the
    target itself), the median width is at most 1.1x the t's."""
    documented = SHAPE_DOCUMENTED[shape.name]
    for n, expected in zip(SHAPE_TASKS, documented, strict=True):
        x = shape.draw(np.random.default_rng([11, n]), SHAPE_STUDIES, n)
        got = task_interval(x[:, :, None], bounds=shape.bounds)
        lo, hi = got.lo[:, 0], got.hi[:, 0]
        shown = ~np.isnan(lo)
        assert shown.mean() > 0.98, (shape.name, n)  # "no interval" only for rare mid-range ties
        assert ((hi - lo)[shown] > 0).all(), (shape.name, n)
        cover = float(((lo <= shape.truth) & (shape.truth <= hi))[shown].mean())
        _assert_documented(cover, expected, int(shown.sum()), (shape.name, n))
        t_lo, t_hi = _plain_t(x[:, :, None])
        t_lo, t_hi = t_lo[:, 0], t_hi[:, 0]
        t_cover = float(((t_lo <= shape.truth) & (shape.truth <= t_hi)).mean())
        if 0.93 <= t_cover <= 0.975:
            has = shown & (t_hi > t_lo)
            ratio = float(np.median((hi - lo)[has] / (t_hi - t_lo)[has]))
            assert ratio <= T_VALID_WIDTH, (shape.name, n, ratio)


def _assert_documented(cover: float, expected: float, shown: int, cell: tuple[str, int]) -> None:
    """Inside the target [0.93, 0.975] where documented there, and at the documented value,
    within the binomial tolerance of this run's and the documented run's studies."""
    p = min(max(expected, 0.9), 0.99)  # the binomial SE, kept off the degenerate ends
    tolerance = SHAPE_Z * math.sqrt(p * (1 - p) * (1 / shown + 1 / 20_000))
    if 0.93 <= expected <= 0.975:
        assert 0.93 - tolerance <= cover <= 0.975 + tolerance, (cell, cover)
    assert abs(cover - expected) <= tolerance, (cell, cover, expected)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: pair.name)
def test_paired_coverage_on_the_score_shapes_studies_produce(pair: Pair) -> None:
    """Issue 37, paired differences between groups: each pair at 3-40 tasks covers inside
    [0.93, 0.975] or at its documented value, never with a zero-width interval, inside [-1, 1]
    for [0, 1] scores; where the plain t on the differences is valid, at most 1.1x its median
    width unless documented wider, and never wider than documented (by 5%)."""
    documented, widths = PAIR_DOCUMENTED[pair.name]
    for n, expected, width in zip(SHAPE_TASKS, documented, widths, strict=True):
        a, b = pair.draw(np.random.default_rng([12, n]), SHAPE_STUDIES, n)
        got = paired_interval(a[:, :, None], b[:, :, None], bounds=pair.bounds)
        lo, hi = got.lo[:, 0], got.hi[:, 0]
        shown = ~np.isnan(lo)
        assert shown.mean() > 0.9, (pair.name, n)  # "no interval" only where differences tie
        assert ((hi - lo)[shown] > 0).all(), (pair.name, n)
        if pair.bounds is not None:
            assert (lo[shown] >= -1).all() and (hi[shown] <= 1).all(), (pair.name, n)
        cover = float(((lo <= pair.truth) & (pair.truth <= hi))[shown].mean())
        _assert_documented(cover, expected, int(shown.sum()), (pair.name, n))
        t_lo, t_hi = _plain_t((b - a)[:, :, None])
        t_lo, t_hi = t_lo[:, 0], t_hi[:, 0]
        t_cover = float(((t_lo <= pair.truth) & (pair.truth <= t_hi)).mean())
        has = shown & (t_hi > t_lo)
        ratio = float(np.median((hi - lo)[has] / (t_hi - t_lo)[has]))
        assert ratio <= 1.05 * width, (pair.name, n, ratio, width)
        if 0.93 <= t_cover <= 0.975:
            assert ratio <= max(T_VALID_WIDTH, 1.05 * width), (pair.name, n, ratio)


def simulate_pair(n_tasks: int, *, task_sd: float, seed: int) -> tuple[FloatArray, FloatArray]:
    """Two groups on the log-normal model above with the same task effects (a task hard for one
    group is hard for the other), group b's curve the reverse of group a's: task means of each,
    [studies, tasks, checkpoints]. The true difference is CURVE[::-1] - CURVE."""
    rng = np.random.default_rng(seed)
    task = _lognormal(rng, task_sd, (STUDIES, n_tasks, 1, 1))
    groups = []
    for curve in (CURVE, CURVE[::-1]):
        scores = (
            curve
            * task
            * _lognormal(rng, 0.1, (STUDIES, n_tasks, 1, len(CURVE)))
            * _lognormal(rng, 0.3, (STUDIES, n_tasks, 4, 1))
            * _lognormal(rng, 0.2, (STUDIES, n_tasks, 4, len(CURVE)))
        )
        counts = rng.integers(2, 5, size=(STUDIES, n_tasks))
        scores[np.arange(4)[None, None, :] >= counts[..., None]] = np.nan
        groups.append(np.nanmean(scores, axis=2))
    return groups[0], groups[1]


@pytest.mark.parametrize("task_sd", [0.35, 0.8])
def test_paired_differences_of_skewed_groups_cover_closer_to_95_than_the_t(task_sd: float) -> None:
    """RE-Bench-like groups at 5 shared tasks: documented in `analysis.intervals` at 0.948 (task
    sd 0.35) and 0.930 (0.80) on average over the checkpoints, where the skew-corrected t on the
    differences alone covers 0.934 and 0.896."""
    a, b = simulate_pair(5, task_sd=task_sd, seed=505 + int(100 * task_sd))
    truth = CURVE[::-1] - CURVE
    got = paired_interval(a, b)
    cover = np.mean((got.lo <= truth) & (truth <= got.hi), axis=0)
    t_only = task_interval(b - a, log_scale=False)
    skew = np.mean((t_only.lo <= truth) & (truth <= t_only.hi), axis=0)
    assert np.abs(cover - NOMINAL).mean() < np.abs(skew - NOMINAL).mean(), (cover, skew)
    assert abs(cover.mean() - {0.35: 0.948, 0.8: 0.930}[task_sd]) <= 3 * SE, cover.mean()


def test_paired_interval_is_the_paired_t_where_no_group_ties_or_meets_the_range() -> None:
    """On [0, 1] with a task at 0, MOVER from the groups' t-intervals (Pearson correlation) is
    the plain t on the differences whenever no group ties and no bound binds: nothing is lost
    where the t holds."""
    rng = np.random.default_rng(4)
    a = np.concatenate([[0.0], rng.uniform(0.4, 0.6, 9)])[:, None]
    b = np.clip(a + rng.normal(0.05, 0.05, a.shape), 0, 1)
    got = paired_interval(a, b, bounds=UNIT)
    assert got.methods()[0] == MOVER_T_METHOD
    t_lo, t_hi = _plain_t((b - a)[None])
    assert (got.lo[0], got.hi[0]) == (pytest.approx(t_lo[0, 0]), pytest.approx(t_hi[0, 0]))
    # Without a task at an end, the skew-corrected t on the differences.
    inner = paired_interval(a + 0.1, np.clip(b + 0.1, 0, 0.99), bounds=UNIT)
    assert inner.methods()[0] == SKEW_METHOD


def test_a_task_at_0_for_both_groups_does_not_make_them_move_as_one() -> None:
    """Three tasks, one at 0 for both groups: the Pearson r is 0.99998, and MOVER at that r
    would take the two groups' errors to cancel (zero-inflated pairs covered 0.910 so). The
    correlation is held to MAX_MOVER_CORRELATION: the bounds are MOVER's at r = 0.95 from the
    groups' t-intervals held inside [0, 1]."""
    a = np.array([[0.0], [0.8], [0.9]])
    b = np.array([[0.0], [0.85], [0.95]])
    assert np.corrcoef(a[:, 0], b[:, 0])[0, 1] > 0.9999
    got = paired_interval(a, b, bounds=UNIT)
    assert got.methods()[0] == MOVER_T_METHOD
    half = float(stats.t.ppf(0.975, 2)) * np.std(np.hstack([a, b]), axis=0, ddof=1) / math.sqrt(3)
    mean = np.hstack([a, b]).mean(axis=0)
    below, above = np.minimum(half, mean), np.minimum(half, 1 - mean)  # held inside [0, 1]
    r, gap = MAX_MOVER_CORRELATION, mean[1] - mean[0]
    lo = gap - math.sqrt(below[1] ** 2 + above[0] ** 2 - 2 * r * below[1] * above[0])
    hi = gap + math.sqrt(above[1] ** 2 + below[0] ** 2 - 2 * r * above[1] * below[0])
    assert r == 0.95
    assert (got.lo[0], got.hi[0]) == (pytest.approx(lo), pytest.approx(hi))
    assert got.hi[0] - gap > 0.2  # at r = 0.99998 it was 0.167: the reaches' difference only


def test_one_task_high_for_both_groups_does_not_make_skewed_groups_move_as_one() -> None:
    """Unbounded scores, 12 tasks whose groups vary independently but for one task at 30 in
    both: the Pearson r of the values is 0.99, which says only that this task dominates both
    samples. The correlation MOVER takes is the one a bivariate log-normal model implies from
    the logs, (e^(r s_a s_b) - 1) / sqrt((e^(s_a^2) - 1) (e^(s_b^2) - 1)): the upper bound is
    MOVER's at that r, not at the Pearson r held to 0.95 (0.7 narrower), and the lower side is
    held to 3 t half-widths of the differences."""
    rng = np.random.default_rng(3)
    a, b = np.exp(rng.normal(0, 0.5, (2, 12, 1)))
    a[0] = b[0] = 30.0
    assert np.corrcoef(a[:, 0], b[:, 0])[0, 1] > 0.99
    log_a, log_b = np.log(a[:, 0]), np.log(b[:, 0])
    r_log = np.corrcoef(log_a, log_b)[0, 1]
    s_a, s_b = log_a.std(ddof=1), log_b.std(ddof=1)
    implied = math.expm1(r_log * s_a * s_b) / math.sqrt(math.expm1(s_a**2) * math.expm1(s_b**2))
    group_a, group_b = task_interval(a, profile=False), task_interval(b, profile=False)
    below_a, above_b = group_a.mean[0] - group_a.lo[0], group_b.hi[0] - group_b.mean[0]
    got = paired_interval(a, b)
    assert got.methods()[0] == MOVER_LOG_METHOD
    gap = float(got.mean[0])

    def upper(r: float) -> float:
        return gap + math.sqrt(above_b**2 + below_a**2 - 2 * r * above_b * below_a)

    assert got.hi[0] == pytest.approx(upper(implied))
    assert got.hi[0] - upper(MAX_MOVER_CORRELATION) > 0.5
    t_lo, t_hi = _plain_t((b - a)[None])
    half = float(t_hi[0, 0] - t_lo[0, 0]) / 2
    assert got.lo[0] == pytest.approx(gap - MAX_MOVER_STRETCH * half)


def test_a_group_tied_at_an_end_enters_with_its_exact_bound() -> None:
    """Group a at 0 on all 3 tasks: its mean is known only to lie in [0, 1 - 0.05^(1/3)], and
    the difference's lower side carries that (the paired t would ignore it). Group b's t-interval
    is held inside [0, 1]."""
    a = np.zeros((3, 1))
    b = np.array([[0.2], [0.5], [0.8]])
    got = paired_interval(a, b, bounds=UNIT)
    assert got.methods()[0] == MOVER_T_METHOD
    reach = 1 - 0.05 ** (1 / 3)
    assert got.lo[0] == pytest.approx(0.5 - math.hypot(0.5, reach))  # b's side held at its 0
    assert got.hi[0] == pytest.approx(1.0)
    t_lo, _ = _plain_t(b[None])
    assert got.lo[0] < t_lo[0, 0]


def test_paired_interval_swaps_sign_with_the_groups() -> None:
    rng = np.random.default_rng(8)
    a = np.exp(rng.normal(0, 1.0, (200, 5, 1)))
    b = np.exp(rng.normal(0, 0.5, (200, 5, 1)))
    for bounds, x, y in ((None, a, b), (UNIT, a / (1 + a), np.where(b > 1.5, 0.0, b / 2))):
        ab, ba = paired_interval(x, y, bounds=bounds), paired_interval(y, x, bounds=bounds)
        np.testing.assert_allclose(ab.lo, -ba.hi)
        np.testing.assert_allclose(ab.hi, -ba.lo)


def test_a_constant_gap_between_groups_that_differ_by_factors_stays_narrow() -> None:
    """Unbounded scores, tasks from 0.05 to 3, group b 0.1 ahead on every task: each group's
    log-scale interval is wide and lopsided, and MOVER would add their lopsidedness although it
    cancels in the differences; each side is held to 3 t half-widths of the differences, so
    the clear gap is separated from 0."""
    rng = np.random.default_rng(6)
    a = np.array([[0.05], [0.5], [1.0], [2.0], [3.0]])
    b = a + 0.1 + rng.normal(0, 0.005, a.shape)
    got = paired_interval(a, b)
    assert got.methods()[0] == MOVER_LOG_METHOD
    t_lo, t_hi = _plain_t((b - a)[None])
    half = float(t_hi[0, 0] - t_lo[0, 0]) / 2
    assert got.mean[0] - got.lo[0] <= MAX_MOVER_STRETCH * half * (1 + 1e-9)
    assert got.hi[0] - got.mean[0] <= MAX_MOVER_STRETCH * half * (1 + 1e-9)
    assert got.lo[0] > 0
    wide = task_interval(a)
    assert wide.hi[0] - wide.lo[0] > 10 * (got.hi[0] - got.lo[0])


def test_bounded_scores_pick_their_interval_by_where_they_sit() -> None:
    """On [0, 1]: a task at an end -> plain t; under 10 tasks near an end -> the log scale on
    the distance from that end (mirrored near 1); in the middle -> the skew-corrected t."""
    cases = np.array(
        [
            [0.0, 0.02, 0.5, 0.97],
            [0.1, 0.05, 0.6, 0.99],
            [0.3, 0.2, 0.4, 0.90],
        ]
    )
    got = task_interval(cases, bounds=UNIT)
    assert list(got.methods()) == [PLAIN_METHOD, END_LOG_METHOD, SKEW_METHOD, END_LOG_METHOD]
    # Near 1 the interval is the mirror image of the same distances near 0.
    mirrored = task_interval(1 - cases[:, [3]], bounds=UNIT)
    assert got.lo[3] == pytest.approx(1 - mirrored.hi[0])
    assert got.hi[3] == pytest.approx(1 - mirrored.lo[0])
    assert 0 <= got.lo[1] < got.mean[1] < got.hi[1] <= 1
    many = np.tile(cases[:, [1]], (4, 1)) + np.linspace(0, 0.01, 12)[:, None]
    assert task_interval(many, bounds=UNIT).methods()[0] == SKEW_METHOD  # 10+ tasks


def test_left_skewed_logs_near_an_end_take_the_skew_corrected_t() -> None:
    """Under 10 tasks near an end, values whose logs trail off to the left (one task far nearer
    the end than the rest: bounded, not log-normal) take the skew-corrected t; values spread by
    factors both ways keep the log scale. Three or four values never count as left-skewed (their
    sample skewness cannot reach LEFT_SKEWED_LOGS)."""
    trailing = np.array([0.004, 0.2, 0.22, 0.25, 0.28])
    by_factors = np.array([0.01, 0.03, 0.1, 0.3, 0.9])
    got = task_interval(np.stack([trailing, by_factors], axis=1), bounds=UNIT)
    assert list(got.methods()) == [SKEW_METHOD, END_LOG_METHOD]
    # Mirrored near 1, the same.
    assert task_interval(1 - trailing[:, None], bounds=UNIT).methods()[0] == SKEW_METHOD
    assert LEFT_SKEWED_LOGS < -0.75  # 4 values' skewness is at least -0.75
    four = task_interval(np.array([[0.004], [0.2], [0.22], [0.25]]), bounds=UNIT)
    assert four.methods()[0] == END_LOG_METHOD


@pytest.mark.parametrize("n_tasks", [6, 8])
def test_bounded_tasks_with_beta_attempts_cover_inside_the_target_under_10_tasks(
    n_tasks: int,
) -> None:
    """Beta task means with 4 beta attempts each (`score_shapes`), between the 5 and 10 tasks of
    the documented table: 0.985 / 0.988 at 6 / 8 tasks with the log scale on every sample near
    the end (20,000 studies), inside [0.93, 0.975] now (0.965, 0.965)."""
    shape = next(shape for shape in SHAPES if shape.name == "beta tasks, beta attempts x4")
    x = shape.draw(np.random.default_rng([13, n_tasks]), STUDIES, n_tasks)
    got = task_interval(x[:, :, None], bounds=shape.bounds)
    cover = float(np.mean((got.lo[:, 0] <= shape.truth) & (shape.truth <= got.hi[:, 0])))
    assert 0.93 - 3 * SE <= cover <= 0.975 + 3 * SE, cover


def test_values_piled_at_an_end_get_the_effective_wilson_interval_from_20_tasks() -> None:
    """From 20 tasks on, [0, 1] values with a task at an end get the Wilson score interval on
    the effective number of tasks (the plain t covered 0.90 on zero-heavy ties there): its
    bounds are the roots of the score test (p - mu)^2 = z^2 deff mu (1 - mu) / n, it reaches
    further above a mean near 0 than below it, stays inside the range, and mirrors near 1.
    Under 20 tasks the same kind of values keep the plain t."""
    values = np.zeros((WILSON_MIN_TASKS, 2))
    values[:3, 0] = [1.0, 0.5, 1.0]  # 2 of 20 tasks solved, one half, 17 at 0
    values[:4, 1] = [0.5, 1.0, 0.25, 0.75]  # partial scores, most tasks at 0
    got = task_interval(values, bounds=UNIT)
    assert list(got.methods()) == [WILSON_METHOD, WILSON_METHOD]
    z, n = float(stats.norm.ppf(0.975)), WILSON_MIN_TASKS
    p, var = values.mean(axis=0), values.var(axis=0, ddof=1)
    deff = var / (p * (1 - p))
    for bound in (got.lo, got.hi):
        np.testing.assert_allclose((p - bound) ** 2, z**2 * deff * bound * (1 - bound) / n)
    assert (got.lo > 0).all() and (got.lo < p).all() and (got.hi - p > p - got.lo).all()
    t_half = float(stats.t.ppf(0.975, n - 1)) * np.sqrt(var / n)
    assert (got.hi > p + t_half).all()  # the t stops short above a mean piled near 0
    mirrored = task_interval(1 - values, bounds=UNIT)
    np.testing.assert_allclose(mirrored.lo, 1 - got.hi)
    np.testing.assert_allclose(mirrored.hi, 1 - got.lo)
    fewer = task_interval(values[1:], bounds=UNIT)
    assert set(fewer.methods()) == {PLAIN_METHOD}
    assert set(task_interval(values).methods()) == {SKEW_METHOD}  # no known range: no Wilson


@pytest.mark.parametrize(
    ("n_tasks", "documented"),
    [(3, 0.9730), (5, 0.9692), (10, 0.9612), (20, 0.9474), (40, 0.9443)],
)
def test_binary_task_values_cover_exactly_as_documented(n_tasks: int, documented: float) -> None:
    """0/1 task values (one attempt, success rate 0.3) take n + 1 possible samples, so their
    coverage is exact, with no simulation error: every count of successes, weighted by its
    binomial probability, over the samples given an interval (`analysis.intervals`: the mid-p
    interval, inside [0.93, 0.975] at every count; the t and the effective-tasks Wilson before
    it gave 0.998 at 5 tasks and 0.9752 at 20)."""
    k = np.arange(n_tasks + 1)
    values = (np.arange(n_tasks)[:, None] < k[None, :]).astype(np.float64)
    got = task_interval(values, bounds=UNIT)
    shown = ~np.isnan(got.lo)
    weight = stats.binom.pmf(k, n_tasks, 0.3)
    covered = (got.lo <= 0.3) & (got.hi >= 0.3) & shown
    assert weight[covered].sum() / weight[shown].sum() == pytest.approx(documented, abs=1e-4)


def test_tasks_all_at_an_end_get_the_mid_p_interval_for_the_share_at_the_top() -> None:
    """Pass/fail task values (every task at an end of the range, not all at one): the mid-p
    exact interval for the binomial share of tasks at the top, at any number of tasks; its
    bounds leave (1 - level) / 2 in the mid-p tail beyond the count, it contains the share, it
    mirrors with the range, and it maps onto another range. A task in between keeps the rule the
    values had before; all at one end keep the exact bound."""
    values = np.array([[1.0, 1.0], [0.0, 0.0], [0.0, 0.5], [0.0, 0.0], [1.0, 0.0]])
    got = task_interval(values, bounds=UNIT)
    assert list(got.methods()) == [BINARY_METHOD, PLAIN_METHOD]
    k, n = 2, 5
    lo, hi = float(got.lo[0]), float(got.hi[0])
    assert 0 < lo < k / n < hi < 1
    above = stats.binom.sf(k, n, lo) + stats.binom.pmf(k, n, lo) / 2
    below = stats.binom.cdf(k - 1, n, hi) + stats.binom.pmf(k, n, hi) / 2
    np.testing.assert_allclose([above, below], [0.025, 0.025], atol=1e-10)
    # Narrower than Clopper-Pearson's exact interval, whose whole observed count is in each tail.
    assert stats.beta.ppf(0.025, k, n - k + 1) < lo and hi < stats.beta.ppf(0.975, k + 1, n - k)
    mirrored = task_interval(1 - values, bounds=UNIT)
    np.testing.assert_allclose([mirrored.lo[0], mirrored.hi[0]], [1 - hi, 1 - lo])
    scaled = task_interval(values * 10 - 5, bounds=(-5.0, 5.0))
    np.testing.assert_allclose([scaled.lo[0], scaled.hi[0]], [lo * 10 - 5, hi * 10 - 5])
    many = np.zeros((40, 1))
    many[:12] = 1.0
    assert list(task_interval(many, bounds=UNIT).methods()) == [BINARY_METHOD]
    assert list(task_interval(np.zeros((5, 1)), bounds=UNIT).methods()) == [EDGE_BOUND]
    assert list(task_interval(values[:, :1]).methods()) == [SKEW_METHOD]  # no known range


def test_zeros_and_negative_values_use_the_skew_corrected_t() -> None:
    """A log scale needs every task value above 0: with a task at 0 (normalised scores start
    there) or a negative paired difference the interval is the Hall-corrected t, which may
    reach below 0; with all values positive the log-scale bounds are positive."""
    positive = task_interval(np.array([[0.01], [0.2], [0.3]]))
    assert 0 < positive.lo[0] < positive.mean[0] < positive.hi[0]
    with_zero = task_interval(np.array([[0.0], [0.2], [0.3]]))
    assert with_zero.lo[0] < 0 < with_zero.mean[0] < with_zero.hi[0]
    shifted = task_interval(np.array([[-0.1], [0.1], [0.2]]))
    np.testing.assert_allclose(shifted.lo + 0.1, with_zero.lo)  # the t path is shift-equivariant
    np.testing.assert_allclose(shifted.hi + 0.1, with_zero.hi)


def test_one_task_gives_no_interval_and_ties_are_never_a_zero_width_interval() -> None:
    one = task_interval(np.array([[0.4, np.nan], [np.nan, np.nan]]))
    assert one.mean[0] == 0.4 and math.isnan(one.lo[0]) and math.isnan(one.hi[0])
    assert one.n_tasks.tolist() == [1, 0]
    # Every task tied: no spread, so no interval, and the method says why.
    tied = task_interval(np.full((3, 2), 0.1))
    assert np.isnan(tied.lo).all() and np.isnan(tied.hi).all()
    assert tied.mean[0] == pytest.approx(0.1)
    assert set(tied.methods()) == {TIED}
    # At an end of a known range the exact bound: [0, 1 - 0.05^(1/n)] for n tasks at 0.
    floor = task_interval(np.zeros((3, 1)), bounds=(0.0, 1.0))
    assert (floor.lo[0], floor.hi[0]) == (0.0, pytest.approx(1 - 0.05 ** (1 / 3)))
    ceiling = task_interval(np.ones((5, 1)), bounds=(0.0, 1.0))
    assert (ceiling.lo[0], ceiling.hi[0]) == (pytest.approx(0.05 ** (1 / 5)), 1.0)
    assert set(floor.methods()) == {EDGE_BOUND}
    with pytest.raises(ValueError):
        task_interval(np.zeros((3, 1)), level=1.0)
    with pytest.raises(ValueError, match="low < high"):
        task_interval(np.zeros((3, 1)), bounds=(1.0, 0.0))


def test_bounded_scores_get_bounds_inside_their_range() -> None:
    rng = np.random.default_rng(5)
    values = rng.beta(0.5, 3.0, size=(STUDIES, 3, 1))
    got = task_interval(values, bounds=(0.0, 1.0))
    free = task_interval(values)
    assert (free.hi > 1).any()  # without the range, some upper bounds run past 1
    assert (got.lo >= 0).all() and (got.hi <= 1).all()


def test_the_exact_bound_for_tasks_all_at_zero_covers() -> None:
    """Zero-inflated bounded tasks (70% exactly 0, the rest uniform): studies whose 3 tasks are
    all at 0 get the exact bound, which misses the true mean (0.15) in at most 5% of them."""
    rng = np.random.default_rng(9)
    zero = rng.random((STUDIES, 3, 1)) < 0.7
    values = np.where(zero, 0.0, rng.random((STUDIES, 3, 1)))
    got = task_interval(values, bounds=(0.0, 1.0))
    all_zero = got.tied[:, 0]
    assert all_zero.mean() == pytest.approx(0.7**3, abs=0.02)
    covered = (got.lo[all_zero, 0] <= 0.15) & (got.hi[all_zero, 0] >= 0.15)
    assert covered.all()  # 0.15 < 1 - 0.05^(1/3) = 0.63: the bound is exact, not tight


def test_bounds_carry_no_monte_carlo_error() -> None:
    """Finding 2: the same data give the same bounds on every call (no replicates are drawn)."""
    means = simulate_task_means(5, task_sd=0.35, seed=3)[:50]
    first, second = task_interval(means), task_interval(means.copy())
    np.testing.assert_array_equal(first.lo, second.lo)
    np.testing.assert_array_equal(first.hi, second.hi)


def test_skewness_correction_is_capped_for_one_outlying_task() -> None:
    """Four similar tasks and a low one (paired differences, so the t path): the lower side
    stretches, but at most twice the plain t-interval's half-width (uncapped, Hall's inverse
    put it 9 standard errors away)."""
    means = np.array([[0.342], [0.287], [0.347], [0.034], [0.310]]) - 0.1
    got = task_interval(means)
    _, plain_hi = _plain_t(means[None, :, :])
    half = float(plain_hi[0, 0] - got.mean[0])
    assert got.mean[0] - got.lo[0] == pytest.approx(2 * half, rel=1e-6)
    assert half > got.hi[0] - got.mean[0] > 0.5 * half
