"""Confidence intervals over tasks that hold with the 2 to 10 tasks real baseline studies have.

The unit of replication is the task: a group's score at a checkpoint is the mean over tasks of
each task's mean attempt score, and tasks are what a study samples from the population of
possible tasks. So the interval is built from one number per task (its mean attempt score, its
best-of-k estimate, or the paired difference between two groups on it), with ``n - 1`` degrees
of freedom. Attempts within a task need no separate term: their noise is already inside each
task's number.

Why not the hierarchical bootstrap's percentile interval: with 2 or 3 tasks a resampled mean
takes only 3 or 10 distinct values, the expanded tail that corrects its narrowness falls below
one replicate, and the "95%" interval becomes the min-max of the replicates (coverage 0.75 at 2
tasks, 0.86 at 3, moving with the number of replicates). A t-interval needs no replicates, so its
bounds carry no Monte Carlo error at all.

Scores are right-skewed (a few tasks do much better than the rest), and a skewed sample's mean
and standard deviation rise together, so a plain t-interval misses high values of the mean more
often than it should (0.92-0.93 measured at 3-10 tasks on RE-Bench-shaped data, 0.86-0.88 with
heavy skew). Two corrections, each where it applies:

- Every task value above 0 (task mean scores of a group, best-of-k estimates): the modified Cox
  interval for the mean of log-normal values (Land 1972; Zhou & Gao 1997, Stat. Med.). With y
  the logs of the n task values, mean ybar and variance s^2,

      exp(ybar + s^2 / 2  +/-  t_{n-1} sqrt(s^2 / n + s^4 / (2 (n - 1)))).

  Normalised scores are ratios to a reference, and tasks differ from one another by factors
  (one task twice as hard as another), which is what a log scale makes symmetric. The reported
  estimate stays the plain mean over tasks, and the bounds are held to contain it. When one task
  is near 0 the upper bound runs off (e^50 and beyond); it is held to MAX_LOG_STRETCH = 4 plain
  t half-widths from the mean, which costs under 0.0002 coverage even with heavy skew.
- Some task value at 0 or below (a task where nobody beat the starting solution yet) and every
  paired difference between groups (whose sign is not fixed): the t-interval with Hall's (1992)
  skewness correction, f(T) = T + a T^2 / 3 + a^2 T^3 / 27 + a / 6, a = skewness / sqrt(n),
  inverted at the Student-t quantiles, capped to stretch a side at most MAX_STRETCH = 2 times
  (where f flattens its inverse runs away: one low task among four similar ones put the lower
  bound 9 standard errors away).

Fewer than MIN_TASKS = 3 tasks: no interval. With 2 tasks the only interval there is (t on one
degree of freedom, 12.7 standard errors each side; the sample skewness of 2 values is 0) covers
0.913-0.947 depending on the skew, never reliably 95%, and a "95%" beside it would mislead.

Measured coverage of the nominal 95% interval, mean over the 7 checkpoints [lowest, highest]
(40,000 simulated studies each; scores lognormal in task, task x checkpoint, attempt and attempt x
checkpoint effects, task sd on the log scale as below; tasks with 2-4 attempts;
tests/analysis/test_coverage.py checks every checkpoint against 95% within the binomial
tolerance at task sd 0.10-0.35, and heavy skew against the values here):

    task sd  2 tasks (t_1)  3 tasks            5 tasks            10 tasks
    0.10     0.947          0.950 [.949-.951]  0.950 [.948-.951]  0.950 [.949-.951]  mild
    0.25     0.944          0.948 [.947-.949]  0.949 [.948-.949]  0.950 [.949-.952]
    0.35     0.942          0.947 [.946-.948]  0.948 [.946-.950]  0.949 [.947-.951]  RE-Bench
    0.80     0.913          0.937 [.936-.937]  0.940 [.939-.941]  0.945 [.944-.945]  heavy

The previous default, Hall's t alone, covered 0.936 / 0.930 / 0.939 at 3 / 5 / 10 tasks with task
sd 0.35 and 0.891 / 0.884 / 0.908 with 0.80; the plain t 0.931 / 0.923 / 0.929 and 0.878 / 0.856 /
0.872 (benchmarks/coverage_study.py, 8,000 studies).

benchmarks/coverage_study.py compares the methods on two more models (8,000 studies each, mean
over checkpoints [lowest-highest]):

- bounded rubric fractions in [0, 1] (PaperBench-like; logistic in progress minus task
  difficulty, task sd on the logit scale 0.5-1.5): at 3 tasks the default covers 0.938-0.947 on
  average (lowest checkpoint 0.919, near the ceiling; plain t 0.879-0.930, lowest 0.784; Hall t
  0.897-0.935, lowest 0.822), at 5 tasks 0.946-0.952 (0.936-0.964 by checkpoint). At 10 tasks
  it is conservative, 0.958-0.976 (up to 0.985): task values near the ceiling are left-skewed
  and a log scale over-widens them.
- RE-Bench-like best-so-far scores that stay exactly 0 until an attempt beats the starting
  solution: at the first checkpoint all 3 tasks are often still at 0, the interval is then the
  point 0, and no method covers there (0.667 at 3 tasks, 0.832 at 5, 0.920 at 10 for the
  default; 0.67-0.92 for the others). From the third checkpoint on the default covers
  0.932-0.960.

Paired differences between two groups (crossover table) have no log scale to use: with both
groups on the lognormal model above (the same task effects, one group's curve reversed), the
skew-corrected t covers 0.942-0.960 per checkpoint at task sd 0.10, 0.932-0.964 at 0.35 and
0.887-0.975 at 0.80 (3-10 tasks, 8,000 studies): short of 95% with skewed tasks at every task
count measured, not only below the 5 shared tasks where the crossover's note warns of it.

Two rules keep an interval from claiming more than the data show. Scores with a known range
(rubric and EXP-Bench scores in [0, 1]; paired differences of them in [-1, 1]) get bounds inside
that range: a bound outside it is certainly wrong. And a sample without spread (every task the
same value, as early checkpoints often are) is never a zero-width "95%" interval: at the floor
of a known range it gets the exact bound [0, 1 - alpha^(1/n)] (for X in [0, 1], P(X = 0) <= 1 -
mean, so n zeros have probability at most alpha when the mean is above that bound; 0.63 at 3
tasks), at the ceiling its mirror image, and anywhere else no interval, labelled as such.

Not yet solved (issue 37): on the shapes real benchmarks produce the default misses its level in
places. `python benchmarks/coverage_shapes.py` (20,000 studies per cell, one value per task;
coverage / median width over the plain t):

    shape                  3 tasks       5 tasks       10 tasks      20 tasks      40 tasks
    zero-inflated bimodal  0.939 0.43x   0.989 0.89x   0.991 1.02x   0.984 1.01x   0.967 1.01x
    beta(0.5, 3)           0.942 1.48x   0.971 2.26x   0.991 2.48x   0.972 2.46x   0.741 2.17x
    beta(2, 2)             0.945 0.82x   0.953 1.15x   0.968 1.36x   0.979 1.42x   0.981 1.46x
    lognormal sd 0.8       0.938 2.16x   0.939 1.54x   0.945 1.29x   0.946 1.18x   0.949 1.11x
    lognormal sd 1.2       0.924 2.18x   0.930 2.26x   0.935 1.83x   0.942 1.47x   0.947 1.27x

The log scale collapses on bounded values near 0 at many tasks (0.741) and over-widens bounded
ones elsewhere; the skew-corrected t alone covers 0.873 at 3 beta(0.5, 3) tasks. A method per
shape (or one with finite-sample guarantees for bounded means) is still to be chosen.

So the interval over scores holds 95% at 3 to 10 tasks with moderately skewed positive
scores, stays within 1.3 points of it under heavy skew (where the plain t misses by 7-10 points),
over-covers rather than under-covers with many bounded tasks near their ceiling, and falls short
where the data cannot show any spread (every task still at 0 early on).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import optimize, stats

from analysis.bootstrap import FloatArray, IntArray

BoolArray = npt.NDArray[np.bool_]
StrArray = npt.NDArray[np.str_]

LOG_METHOD = "log-scale (Cox) t over tasks"
SKEW_METHOD = "skew-corrected t over tasks"
NO_INTERVAL = "no interval (fewer than 3 tasks)"
TIED = "no interval (every task has the same value: no spread to measure)"
EDGE_BOUND = "exact bound (every task at the end of the score range)"
METHOD = (
    "t over tasks, log-scale (Cox) where all tasks are above 0, else skew-corrected; "
    "none under 3 tasks or when every task ties (at the end of a known range: the exact bound); "
    "held inside a known score range"
)
METHOD_DETAIL = (
    "where every task value is above 0, the modified Cox interval for the mean of log-normal "
    "values (t on the logs of the task values, df = tasks - 1); where a task is at 0 and for "
    "paired differences, the t-interval over task values with the Hall (1992) skewness "
    "correction; fewer than 3 tasks: no interval (none holds 95% with skewed scores there); "
    "every task the same value: no interval, except at an end of a known range (rubric scores in "
    "[0, 1]), where the exact bound [0, 1 - alpha^(1/n)] (or its mirror) holds; bounds held "
    "inside a known range; no resampling, so no Monte Carlo error"
)
MIN_TASKS = 3  # fewer tasks give no interval: at 2, no method holds 95% with skewed scores


@dataclass(frozen=True)
class TaskInterval:
    """Mean over tasks and its interval, per column; NaN bounds where fewer than MIN_TASKS."""

    mean: FloatArray
    lo: FloatArray
    hi: FloatArray
    n_tasks: IntArray
    log_scale: BoolArray  # where the log-scale interval was used (else skew-corrected t)
    tied: BoolArray  # every task has the same value: no t-interval (see TIED, EDGE_BOUND)

    def methods(self) -> StrArray:
        """The method of each column's interval, in the words shown beside it."""
        named = np.where(self.log_scale, LOG_METHOD, SKEW_METHOD)
        tied = np.where(np.isnan(self.lo), TIED, EDGE_BOUND)
        named = np.where(self.tied, tied, named)
        return np.where(self.n_tasks >= MIN_TASKS, named, NO_INTERVAL)


MAX_STRETCH = 2.0  # the skewness correction may at most double one side of the t-interval
# The log-scale upper bound runs off (e^50 and beyond) when one task's value is near 0; held to
# 4 plain t half-widths, it loses under 0.0002 coverage even with heavy skew (task sd 0.8).
MAX_LOG_STRETCH = 4.0


@functools.lru_cache(maxsize=256)
def _max_skew_term(q: float) -> float:
    """The largest |a| for which the correction stretches a side of the interval by at most
    MAX_STRETCH. Near |a| (q + |a| / 6) = 1 Hall's f flattens and its inverse runs off to
    infinity: one low task among four similar ones then gave a lower bound 9 standard errors
    away. Capping |a| keeps the correction a correction."""
    target = MAX_STRETCH * q

    def excess(a: float) -> float:
        return float(_hall_inverse(q, np.array([-a]))[0]) - target

    upper = 1.0 / q  # at a = 1/q - tiny, the inverse is already past any finite stretch
    return float(optimize.brentq(excess, 1e-9, upper * (1 - 1e-9)))


def _hall_inverse(q: float, a: FloatArray) -> FloatArray:
    """The T solving f(T) = q for Hall's transformation (closed form: f is a shifted cube)."""
    safe = np.where(np.abs(a) > 1e-12, a, 1.0)
    solved = 3.0 / safe * (np.cbrt(1.0 + safe * (q - safe / 6.0)) - 1.0)
    return np.where(np.abs(a) > 1e-12, solved, q)


def task_interval(
    per_task: FloatArray,
    level: float = 0.95,
    *,
    log_scale: bool = True,
    bounds: tuple[float, float] | None = None,
) -> TaskInterval:
    """Interval for the mean over tasks of `per_task[..., tasks, columns]`, NaN = no value.

    Columns whose task values are all above 0 get the log-scale interval unless `log_scale` is
    False (paired differences, whose sign is not fixed; and the coverage study, to compare),
    the others the skew-corrected t. With `bounds` (the scores' known range) the interval is
    held inside it. A column where every task has the same value gets no interval, or, at an
    end of `bounds`, the exact bound for that end (module docstring).
    Vectorised over any leading axes (simulation tests pass thousands of studies at once).
    """
    if not 0 < level < 1:
        raise ValueError("level must lie strictly between 0 and 1")
    x = np.asarray(per_task, dtype=np.float64)
    present = ~np.isnan(x)
    n = present.sum(axis=-2)
    mean, sd, skew = _moments(x, present, n)
    positive = np.all(np.where(present, x, 1.0) > 0, axis=-2) & log_scale
    log_mean, log_sd, _ = _moments(np.log(np.where(present & (x > 0), x, 1.0)), present, n)
    lo = np.full(mean.shape, np.nan)
    hi = np.full(mean.shape, np.nan)
    for size in np.unique(n[n >= MIN_TASKS]):
        at = n == size
        df = int(size) - 1
        q = float(stats.t.ppf(1 - (1 - level) / 2, df))
        cap = _max_skew_term(q)
        a = np.clip(skew[at] / math.sqrt(size), -cap, cap)
        se = sd[at] / math.sqrt(size)
        lo[at] = mean[at] - _hall_inverse(q, a) * se
        hi[at] = mean[at] - _hall_inverse(-q, a) * se
        cox = at & positive
        v = log_sd[cox] ** 2
        centre = log_mean[cox] + v / 2
        half = q * np.sqrt(v / size + v**2 / (2 * df))
        t_half = q * sd[cox] / math.sqrt(size)
        # The reported estimate stays the plain mean over tasks, so the bounds are held to
        # contain it; the upper side at most MAX_LOG_STRETCH plain t half-widths from it.
        with np.errstate(over="ignore"):
            lo[cox] = np.minimum(np.exp(centre - half), mean[cox])
            hi[cox] = np.clip(
                np.exp(centre + half), mean[cox], mean[cox] + MAX_LOG_STRETCH * t_half
            )
    enough = n >= MIN_TASKS
    with np.errstate(invalid="ignore"):
        tied = enough & (sd <= 1e-12 * np.maximum(1.0, np.abs(mean)))
    lo[tied], hi[tied] = np.nan, np.nan
    if bounds is not None:
        low, high = bounds
        if not low < high:
            raise ValueError(f"bounds must be (low, high) with low < high, got {bounds!r}")
        lo, hi = np.clip(lo, low, high), np.clip(hi, low, high)
        with np.errstate(invalid="ignore"):
            reach = (high - low) * (1 - (1 - level) ** (1 / np.maximum(n, 1)))
            floor, ceiling = tied & (mean <= low), tied & (mean >= high)
        lo[floor], hi[floor] = low, (low + reach)[floor]
        lo[ceiling], hi[ceiling] = (high - reach)[ceiling], high
    return TaskInterval(
        mean=mean,
        lo=lo,
        hi=hi,
        n_tasks=n.astype(np.int64),
        log_scale=positive & enough & ~tied,
        tied=tied,
    )


def _moments(x: FloatArray, present: BoolArray, n: IntArray) -> tuple[FloatArray, ...]:
    """Mean, standard deviation (n - 1) and skewness over the task axis, NaN-aware."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, np.where(present, x, 0.0).sum(axis=-2) / np.maximum(n, 1), np.nan)
        dev = np.where(present, x - np.expand_dims(mean, -2), 0.0)
        sd = np.sqrt((dev**2).sum(axis=-2) / np.maximum(n - 1, 1))
        m3 = (dev**3).sum(axis=-2) / np.maximum(n, 1)
        skew = np.where(sd > 0, m3 / np.where(sd > 0, sd, 1.0) ** 3, 0.0)
    return mean, sd, skew
