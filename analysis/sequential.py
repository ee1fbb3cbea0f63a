"""Anytime-valid intervals for a study that is looked at while it runs.

A coordinator looks at the curves every day. A fixed-n 95% interval is 95% for one look at a
sample size fixed in advance; looked at daily, the chance that *some* look excludes the truth
grows with the number of looks (tests/analysis/test_sequential.py measures it). A confidence
sequence is a sequence of intervals that all hold at once with probability 95%, however often
and whenever it is looked at, and whatever is decided from the looks.

The one used here is the betting confidence sequence for the mean of values in [0, 1]
(Waudby-Smith & Ramdas 2024, "Estimating means of bounded random variables by betting", JRSS B:
the hedged capital process with predictable plug-in bets, theorem 3 and section 5.1). For a
candidate mean m, a gambler bets a fraction lambda_i of their wealth that the next value lies
above m and another that it lies below; if m were the mean, the wealth would be a nonnegative
martingale, so by Ville's inequality it exceeds 1/alpha with probability at most alpha ever.
The confidence sequence is the set of m whose wealth has not reached 1/alpha, intersected over
time. It needs bounded values, so it is offered for rubric and EXP-Bench scores (in [0, 1]) and
not for scored tasks' normalised scores, which have no upper bound.

Each task contributes one value when it enters the sequence: the score of its first attempt to
reach the checkpoint (by the time it was measured). A value must not change once seen, and the
mean of first attempts over tasks is the mean the fixed-n interval estimates (tasks weigh the
same). Using one attempt per task makes it wider than the fixed-n interval, which averages every
attempt: the price of being allowed to look every day.
"""

from __future__ import annotations

import math

import numpy as np

from analysis.bootstrap import FloatArray

CS_METHOD = "anytime-valid betting confidence sequence over tasks (first attempt of each task)"
CS_DETAIL = (
    "anytime-valid: a betting confidence sequence for the mean of [0, 1] scores "
    "(Waudby-Smith & Ramdas 2024, hedged capital with predictable plug-in bets), over one value "
    "per task (its first attempt to reach the checkpoint), valid however often it is looked at"
)
GRID_POINTS = 2001  # candidate means 0, 0.0005, ..., 1: bounds are rounded outwards to them
BET_CAP = 0.5  # at most half the wealth is bet (the paper's c = 1/2 truncation)


def betting_cs(values: FloatArray, level: float = 0.95) -> tuple[FloatArray, FloatArray]:
    """Lower and upper bounds after each value of `values[..., t]` (in [0, 1], arrival order).

    Vectorised over leading axes (the simulation tests pass thousands of sequences at once);
    NaN values are not allowed: a sequence holds only what has arrived.
    """
    if not 0 < level < 1:
        raise ValueError("level must lie strictly between 0 and 1")
    x = np.asarray(values, dtype=np.float64)
    if np.isnan(x).any():
        raise ValueError("a confidence sequence is built from values that have arrived: no NaN")
    if ((x < 0) | (x > 1)).any():
        raise ValueError("the betting confidence sequence needs values in [0, 1]")
    alpha = 1 - level
    t_max = x.shape[-1]
    grid = np.linspace(0.0, 1.0, GRID_POINTS)
    lead = x.shape[:-1]
    log_up = np.zeros((*lead, GRID_POINTS))
    log_down = np.zeros((*lead, GRID_POINTS))
    lo = np.zeros((*lead, t_max))
    hi = np.ones((*lead, t_max))
    running_lo = np.zeros(lead)
    running_hi = np.ones(lead)
    mean_hat = np.full(lead, 0.5)
    var_hat = np.full(lead, 0.25)
    threshold = math.log(1 / alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        for t in range(t_max):
            i = t + 1
            bet = np.sqrt(2 * math.log(2 / alpha) / (var_hat * i * math.log(i + 1)))
            bet = np.expand_dims(bet, -1)
            up = np.minimum(bet, BET_CAP / grid)
            down = np.minimum(bet, BET_CAP / (1 - grid))
            step = np.expand_dims(x[..., t], -1) - grid
            log_up += np.log1p(up * step)
            log_down += np.log1p(-down * step)
            # Hedged: half the wealth on each side; m is out once either half reaches 1/alpha.
            wealth = np.logaddexp(log_up, log_down) - math.log(2)
            inside = wealth < threshold
            any_inside = inside.any(axis=-1)
            first = np.argmax(inside, axis=-1)
            last = GRID_POINTS - 1 - np.argmax(inside[..., ::-1], axis=-1)
            low = np.where(any_inside, grid[np.maximum(first - 1, 0)], running_lo)
            high = np.where(any_inside, grid[np.minimum(last + 1, GRID_POINTS - 1)], running_hi)
            running_lo = np.maximum(running_lo, low)
            running_hi = np.minimum(running_hi, high)
            running_hi = np.maximum(running_hi, running_lo)
            lo[..., t], hi[..., t] = running_lo, running_hi
            # Predictable plug-ins for the next bet: shrunk towards 1/2 and 1/4 at the start.
            mean_hat = (mean_hat * i + x[..., t]) / (i + 1)
            var_hat = (var_hat * i + (x[..., t] - mean_hat) ** 2) / (i + 1)
    return lo, hi


def first_values(times: FloatArray, values: FloatArray) -> tuple[FloatArray, FloatArray]:
    """The values of `values[tasks, attempts]` that enter the sequence: per task, the one with
    the earliest time (NaN time: not measured), ordered by that time; returns (values, times)."""
    t = np.asarray(times, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    measured = ~np.isnan(t) & ~np.isnan(v)
    keyed = np.where(measured, t, np.inf)
    pick = np.argmin(keyed, axis=-1)
    rows = np.arange(t.shape[0])
    has = measured.any(axis=-1)
    chosen_t, chosen_v = keyed[rows, pick][has], v[rows, pick][has]
    order = np.argsort(chosen_t, kind="stable")
    return chosen_v[order], chosen_t[order]
