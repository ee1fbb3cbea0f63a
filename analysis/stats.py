"""Trajectories, group curves with hierarchical bootstrap intervals, best-of-k, crossover, cost.

Methods, in the words a figure caption can repeat:
- A trajectory is an attempt's score at each checkpoint. For scored tasks (``best_so_far``) it is
  the best usable score logged by then (RE-Bench's rule); for paper tasks it is the grading of
  the checkpoint's snapshot.
- Missing points stay missing (NaN with a reason). ``carry_forward=True`` fills the checkpoints
  after an attempt ended with its last usable score and marks them ``carried_forward``.
- A group curve is the mean over tasks of the per-task mean attempt score. Its interval is the
  profile-likelihood interval for a log-normal mean over the task means where every task is above
  0, else the t-interval with Hall's skewness correction (`analysis.intervals`; on a known score
  range the rules there): it holds 95% at 3 tasks with skewed scores where percentile bootstraps
  do not, and has no Monte Carlo error. Under 3 tasks
  there is no interval; each row names the method its interval used.
- Best-of-k is the expected maximum of k runs drawn without replacement from a task's runs (the
  unbiased estimator), averaged over tasks, with the same interval over the per-task estimates.
  k above the fewest runs any task has is not estimated (with replacement it is, and marked), so
  every k of a curve averages over the same tasks.
- Two groups are compared only on the tasks both attempted (3 or more). At each checkpoint the
  paired difference (later leader minus early leader, per task, then averaged) gets
  `analysis.intervals.paired_interval`: MOVER from the two groups' intervals and their
  correlation over the tasks (each group's own interval without a known range; the groups'
  t-intervals inside [0, 1] where a task sits at 0 or 1), else the skew-corrected t on the
  differences; each paired point names its method, and the note the rule;
  the early leader is the group ahead at the first checkpoint where the two differ (normalised
  scores tie at 0 at the start). The crossover is where the difference reaches 0, interpolated
  linearly in log-hours between checkpoints; its interval inverts the paired intervals (from
  where the difference's upper bound reaches 0 to where its lower bound does). Separation is the
  first checkpoint where the paired interval lies wholly above 0. A checkpoint without data for
  one of the groups is a gap: named in the result's note, and a crossing across it is flagged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel

from analysis.bootstrap import (
    FloatArray,
    Nested,
    bootstrap_means,
    draw_tasks,
    task_means,
)
from analysis.intervals import MIN_TASKS, PAIRED_METHOD, paired_interval, task_interval
from analysis.missing import MissingReason, PointState
from analysis.sequential import CS_METHOD, betting_cs

TRAJECTORY_COLUMNS: tuple[str, ...] = (
    "study",
    "task",
    "task_kind",
    "group",
    "participant_kind",
    "participant",
    "attempt_id",
    "checkpoint_hours",
    "value",
    "state",
    "measured_at",
    "missing",
    "api_cost_usd",
    "reproduction_status",
    "failure_class",
    "reproduction_failed",
    "floor",
    "synthetic",
)
_EPS = 1e-9


def default_checkpoints(table: pd.DataFrame) -> list[float]:
    hours = table["checkpoint_hours"].dropna()
    return sorted(float(h) for h in hours.unique() if h > 0)


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _floor(row: dict[str, Any]) -> str | None:
    """The failure that put a row's score at the task's floor, if it did."""
    reason = row.get("floor")
    return None if _is_missing(reason) else str(reason)


def _measured(row: dict[str, Any]) -> float:
    value = row.get("measured_at")
    return math.nan if value is None or _is_missing(value) else float(value)


def _floor_count(points: pd.DataFrame) -> int:
    """Points standing at the task's floor (trajectories built elsewhere may lack the column)."""
    if "floor" not in points.columns:
        return 0
    return int(points["floor"].map(lambda f: isinstance(f, str)).sum())


def _usable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if _is_missing(r["missing"]) and not _is_missing(r["score"])]


def trajectories(
    table: pd.DataFrame,
    checkpoints: Sequence[float] | None = None,
    *,
    best_so_far: bool = True,
    carry_forward: bool = False,
) -> pd.DataFrame:
    """One row per attempt and checkpoint reached (or expected), with value and state."""
    hours = sorted(float(h) for h in (checkpoints or default_checkpoints(table)))
    sub_columns = [c for c in table.columns if c.startswith(("cat:", "stage:"))]
    by_attempt: dict[Any, list[dict[str, Any]]] = {}
    for record in table.to_dict("records"):
        by_attempt.setdefault(record["attempt_id"], []).append(record)
    out: list[dict[str, Any]] = []
    for attempt_id in sorted(by_attempt):
        rows = sorted(by_attempt[attempt_id], key=lambda r: r["working_hours"])
        out.extend(_attempt_points(rows, hours, sub_columns, best_so_far, carry_forward))
    frame = pd.DataFrame(out, columns=[*TRAJECTORY_COLUMNS, *sub_columns])
    frame["value"] = frame["value"].astype("float64")
    return frame


def _attempt_points(
    rows: list[dict[str, Any]],
    hours: list[float],
    sub_columns: list[str],
    best_so_far: bool,
    carry_forward: bool,
) -> list[dict[str, Any]]:
    first = rows[0]
    scored = best_so_far and first["task_kind"] == "scored"
    usable = _usable(rows)
    worked = [r["working_hours"] for r in rows if r["source"] != "expected"]
    reached = max((w for w in worked if not _is_missing(w)), default=-math.inf)
    points: list[dict[str, Any]] = []
    for h in hours:
        at = [
            r
            for r in rows
            if not _is_missing(r["checkpoint_hours"]) and abs(r["checkpoint_hours"] - h) < _EPS
        ]
        at_row = at[-1] if at else None
        if at_row is None and reached < h - _EPS:
            continue  # not reached yet, and not expected: the attempt is still running
        point: dict[str, Any] = {c: first.get(c) for c in TRAJECTORY_COLUMNS}
        point.update(
            checkpoint_hours=h,
            value=math.nan,
            state=PointState.MISSING.value,
            missing=MissingReason.NO_SNAPSHOT.value,
            api_cost_usd=math.nan,
            reproduction_status=None,
            failure_class=None,
            reproduction_failed=False,
            floor=None,
            measured_at=math.nan,
        )
        if at_row is not None:
            point.update(
                missing=None if _is_missing(at_row["missing"]) else at_row["missing"],
                api_cost_usd=at_row["api_cost_usd"],
                reproduction_status=at_row["reproduction_status"],
                failure_class=at_row["failure_class"],
                reproduction_failed=bool(at_row["reproduction_failed"]),
            )
            if point["missing"] is None and not _is_missing(at_row["score"]):
                point.update(value=float(at_row["score"]), state=PointState.OBSERVED.value)
                point.update(
                    {c: at_row[c] for c in sub_columns},
                    floor=_floor(at_row),
                    measured_at=_measured(at_row),
                )
        ended = point["missing"] == MissingReason.ENDED_EARLY.value
        if scored and not ended:
            before = [r for r in usable if r["working_hours"] <= h + _EPS]
            if before:
                best = max(before, key=lambda r: r["score"])
                if point["state"] != PointState.OBSERVED.value or best["score"] > point["value"]:
                    point.update(
                        value=float(best["score"]),
                        state=PointState.BEST_SO_FAR.value,
                        floor=_floor(best),
                        measured_at=_measured(best),
                    )
        if ended and carry_forward and usable:
            last = max(usable, key=lambda r: r["score"]) if scored else usable[-1]
            point.update(
                {c: last[c] for c in sub_columns},  # its stage and category scores go with it
                value=float(last["score"]),
                state=PointState.CARRIED_FORWARD.value,
                floor=_floor(last),
                measured_at=_measured(last),
            )
        points.append(point)
    return points


def nested(
    traj: pd.DataFrame,
    group: str,
    tasks: Sequence[str],
    checkpoints: Sequence[float],
    column: str = "value",
) -> Nested:
    """One group's trajectory values as a tasks x attempts x checkpoints array."""
    rows = traj[traj["group"] == group]
    per_task: list[list[int]] = []
    for task in tasks:
        per_task.append(sorted(rows.loc[rows["task"] == task, "attempt_id"].unique().tolist()))
    n_max = max((len(a) for a in per_task), default=0)
    values = np.full((len(tasks), n_max, len(checkpoints)), np.nan)
    index = {h: i for i, h in enumerate(checkpoints)}
    slot = {a: (t, j) for t, attempts in enumerate(per_task) for j, a in enumerate(attempts)}
    for attempt, h, v in zip(
        rows["attempt_id"], rows["checkpoint_hours"], rows[column], strict=True
    ):
        if h in index and attempt in slot and v is not None and not pd.isna(v):
            t, j = slot[attempt]
            values[t, j, index[h]] = float(v)
    counts = np.array([len(a) for a in per_task], dtype=np.int64)
    return Nested(values=values, counts=counts)


def _checkpoints_of(traj: pd.DataFrame) -> list[float]:
    return sorted(float(h) for h in traj["checkpoint_hours"].unique())


BOUNDED_KINDS = frozenset({"paper", "expbench"})  # rubric and stage scores lie in [0, 1]


def score_range(traj: pd.DataFrame) -> tuple[float, float] | None:
    """The known range of the scores: [0, 1] when every task is graded against a rubric or by
    stages; None for scored tasks, whose normalised scores may go below 0 or beyond 1."""
    if "task_kind" not in traj.columns or traj.empty:
        return None
    kinds = set(traj["task_kind"].dropna().unique())
    return (0.0, 1.0) if kinds and kinds <= BOUNDED_KINDS else None


def shared_tasks(traj: pd.DataFrame, column: str = "value") -> list[str]:
    """The tasks on which every group has at least one value: where group means compare like
    with like."""
    used = traj[traj[column].notna()]
    groups = used["group"].unique()
    per_task = used.groupby("task")["group"].nunique()
    return sorted(str(t) for t, n in per_task.items() if n == len(groups))


# The group curves' columns: their header stands even when there is nothing to summarise.
CURVE_COLUMNS = (
    "group", "checkpoint_hours", "mean", "lo", "hi", "n_tasks", "n_attempts", "n_missing",
    "n_floor", "n_carried", "level", "method", "interval", "tasks_basis",
)  # fmt: skip


def group_curves(
    traj: pd.DataFrame,
    *,
    column: str = "value",
    groups: Sequence[str] | None = None,
    level: float = 0.95,
    tasks: Sequence[str] | None = None,
    anytime: bool = False,
) -> pd.DataFrame:
    """Mean, interval and the counts behind them, per group and checkpoint.

    With `tasks` every group's mean is taken over those tasks only (``tasks_basis`` "shared":
    the tasks every group attempted, so that the curves compare like with like); without, each
    group over its own tasks (``tasks_basis`` "own").

    With `anytime` the intervals are anytime-valid confidence sequences (`analysis.sequential`)
    where the scores have a known range, for a study looked at while it runs; ``interval`` says
    which kind each row has ("anytime" or "fixed"), ``method`` how it was computed.

    ``n_tasks`` is the number of tasks the mean and interval rest on (the interval's degrees of
    freedom are ``n_tasks - 1``); ``n_attempts`` the attempts with a value there, of which
    ``n_floor`` stand at the task's floor (a submission that failed its scoring).
    """
    chosen = list(groups) if groups is not None else sorted(traj["group"].unique())
    hours = _checkpoints_of(traj)
    basis = "own" if tasks is None else "shared"
    if tasks is not None:
        traj = traj[traj["task"].isin(list(tasks))]
    names = sorted(traj["task"].unique())
    known = score_range(traj)
    sequential = anytime and known == (0.0, 1.0)
    rows: list[dict[str, Any]] = []
    for group in chosen:
        data = nested(traj, group, names, hours, column)
        got = task_interval(task_means(data.values), level, bounds=known)
        methods = got.methods()
        sub = traj[traj["group"] == group]
        for c, h in enumerate(hours):
            at = sub[sub["checkpoint_hours"] == h]
            used = at[at[column].notna()]
            lo, hi, method = float(got.lo[c]), float(got.hi[c]), str(methods[c])
            if sequential:
                lo, hi = _sequence_bounds(used, column, level)
                method = CS_METHOD
            elif anytime:
                method = f"{method} (fixed-n: anytime-valid needs scores in a known range)"
            rows.append(
                {
                    "group": group,
                    "checkpoint_hours": h,
                    "mean": got.mean[c],
                    "lo": lo,
                    "hi": hi,
                    "n_tasks": int(got.n_tasks[c]),
                    "n_attempts": int(used["attempt_id"].nunique()),
                    "n_missing": int(at[column].isna().sum()),
                    "n_floor": _floor_count(used),
                    "n_carried": int((used["state"] == PointState.CARRIED_FORWARD.value).sum()),
                    "level": level,
                    "method": method,
                    "interval": "anytime" if sequential else "fixed",
                    "tasks_basis": basis,
                }
            )
    return pd.DataFrame(rows, columns=list(CURVE_COLUMNS))


def _sequence_bounds(points: pd.DataFrame, column: str, level: float) -> tuple[float, float]:
    """The confidence sequence's bounds after every task that has a value here: each task's
    first measured attempt, in the order they were measured (attempt order where the times are
    unknown, as in synthetic tables)."""
    if points.empty:
        return math.nan, math.nan
    times = (
        points["measured_at"].astype("float64")
        if "measured_at" in points.columns
        else pd.Series(math.nan, index=points.index)
    )
    if times.isna().all():
        times = points["attempt_id"].astype("float64")
    per_task = [
        (float(t.min()), float(v[t.idxmin()]))
        for (_, t), (_, v) in zip(
            times.groupby(points["task"]), points[column].groupby(points["task"]), strict=True
        )
        if t.notna().any()
    ]
    per_task.sort()
    values = np.clip(np.array([v for _, v in per_task], dtype=np.float64), 0.0, 1.0)
    if len(values) == 0:
        return math.nan, math.nan
    lo, hi = betting_cs(values, level)
    return float(lo[-1]), float(hi[-1])


def group_sizes(traj: pd.DataFrame, column: str = "value") -> pd.DataFrame:
    """Tasks and attempts with at least one value, per group: what every figure states."""
    used = traj[traj[column].notna()]
    out = (
        used.groupby("group")
        .agg(n_tasks=("task", "nunique"), n_attempts=("attempt_id", "nunique"))
        .reset_index()
    )
    return out.astype({"n_tasks": "int64", "n_attempts": "int64"})


# -- best-of-k ---------------------------------------------------------------------------------

UNBIASED = "k of each task's runs drawn without replacement (unbiased)"
PLUG_IN = "k runs drawn with replacement from each task's runs (plug-in, biased low)"


def expected_max_exact(scores: Sequence[float], k: int, *, replace: bool = False) -> float:
    """E[max of k runs] over the empirical distribution of `scores`, from order statistics.

    Without replacement (the default) this is the unbiased estimator of the expected best of k
    fresh runs: P(max = x_(i)) = C(i-1, k-1) / C(n, k), and NaN when k > n (n runs say nothing
    about the best of more). With replacement: P(max <= x_(i)) = (i/n)^k, defined for any k but
    biased low, and above n it only repeats the observed runs.
    """
    x = np.sort(np.asarray([s for s in scores if not math.isnan(s)], dtype=np.float64))
    n = len(x)
    if k < 1:
        raise ValueError("k must be at least 1")
    if n == 0:
        return math.nan
    i = np.arange(1, n + 1, dtype=np.float64)
    if replace:
        weights = (i / n) ** k - ((i - 1) / n) ** k
    else:
        if k > n:
            return math.nan
        total = math.comb(n, k)
        weights = np.array([math.comb(int(j) - 1, k - 1) / total for j in i])
    return float(np.dot(weights, x))


def expected_max_resampled(
    scores: Sequence[float],
    k: int,
    *,
    n_resamples: int = 20_000,
    replace: bool = False,
    rng: np.random.Generator | None = None,
) -> float:
    """E[max of k runs] estimated by drawing k runs `n_resamples` times."""
    x = np.asarray([s for s in scores if not math.isnan(s)], dtype=np.float64)
    generator = rng or np.random.default_rng(0)
    if k < 1:
        raise ValueError("k must be at least 1")
    if len(x) == 0 or (not replace and k > len(x)):
        return math.nan
    if replace:
        picks = generator.integers(0, len(x), size=(n_resamples, k))
    else:
        picks = np.argsort(generator.random((n_resamples, len(x))), axis=1)[:, :k]
    return float(x[picks].max(axis=1).mean())


# The best-of-k table's columns: its header stands even when nothing is scored yet.
BEST_OF_K_COLUMNS = (
    "group", "k", "run_hours", "budget_hours", "expected_max", "lo", "hi", "n_tasks",
    "n_attempts", "fewest_runs", "beyond_data", "absent", "estimator", "level", "method",
)  # fmt: skip


def best_of_k(
    traj: pd.DataFrame,
    ks: Sequence[int],
    *,
    groups: Sequence[str] | None = None,
    replace: bool = False,
    level: float = 0.95,
) -> pd.DataFrame:
    """Expected best of k runs per group, run length (checkpoint) and total budget k x hours.

    Computed per task from that task's runs, then averaged over tasks (tasks weigh the same),
    with an interval over the per-task estimates. Every k of one group and run length averages
    over the same tasks: a k above the fewest runs of any of them (``fewest_runs``) is beyond the
    data (``beyond_data``) and left empty, or, with replacement, estimated and marked. Every row
    says the attempts behind it (``n_attempts``) and, where a value or interval is absent, why
    (``absent``).
    """
    chosen = list(groups) if groups is not None else sorted(traj["group"].unique())
    rows: list[dict[str, Any]] = []
    for group in chosen:
        sub = traj[(traj["group"] == group) & traj["value"].notna()]
        for h, at in sub.groupby("checkpoint_hours"):
            runs = [v["value"].tolist() for _, v in at.groupby("task")]
            fewest = min(len(r) for r in runs)
            for k in ks:
                beyond = k > fewest
                per_task = np.array(
                    [
                        [
                            math.nan
                            if beyond and not replace
                            else expected_max_exact(r, k, replace=replace)
                        ]
                        for r in runs
                    ]
                )
                got = task_interval(per_task, level, bounds=score_range(traj))
                method = str(got.methods()[0])
                absent = None
                if beyond and not replace:
                    absent = f"k = {k} is beyond the data: a task has only {fewest} run(s)"
                    method = "none: " + absent
                elif math.isnan(float(got.lo[0])):
                    absent = f"no interval: {method}"
                rows.append(
                    {
                        "group": group,
                        "k": k,
                        "run_hours": float(h),
                        "budget_hours": k * float(h),
                        "expected_max": float(got.mean[0]),
                        "lo": float(got.lo[0]),
                        "hi": float(got.hi[0]),
                        "n_tasks": len(runs),
                        "n_attempts": int(at["attempt_id"].nunique()),
                        "fewest_runs": fewest,
                        "beyond_data": beyond,
                        "absent": absent,
                        "estimator": PLUG_IN if replace else UNBIASED,
                        "level": level,
                        "method": method,
                    }
                )
    return pd.DataFrame(rows, columns=list(BEST_OF_K_COLUMNS))


# -- crossover ---------------------------------------------------------------------------------

MIN_SHARED_TASKS = MIN_TASKS  # a paired interval needs 3 tasks both groups attempted
FEW_SHARED_TASKS = 5  # below this the note warns that coverage falls short under skew


TIE_TOLERANCE = 0.01  # a paired mean difference within this is a tie: nobody leads


class PairedPoint(BaseModel):
    """Later leader minus early leader at one checkpoint, over the tasks with both."""

    hours: float
    difference: float
    lo: float
    hi: float
    n_tasks: int
    method: str  # the interval's method at this checkpoint
    leader: str | None  # the group ahead by more than the tolerance; None: tied
    separated: bool  # the interval excludes 0, in the leader's favour


class Crossing(BaseModel):
    """One change of the leader: the group behind draws level and goes ahead."""

    from_leader: str
    to_leader: str
    estimate_hours: float  # where the paired difference passes 0 (log-hours interpolation)
    ci_low_hours: float  # -inf: at or before the old leader's first checkpoint in front
    ci_high_hours: float  # +inf: the new leader is never separated within its lead
    first_separated_hours: float | None  # first checkpoint of the new lead excluding 0
    crosses_gap: bool  # the estimate interpolates across a checkpoint without a paired value


class CrossoverResult(BaseModel):
    """Who leads when, with every change of the leader and the paired differences behind it.

    The ``estimate_hours``/``ci_*`` fields are those of the first crossing (or, when the lead never
    changes, the open interval of a crossing not seen yet); ``crossings`` lists them all.
    """

    early_leader: str
    late_leader: str  # the other group: the paired differences are late minus early
    leader_from_hours: float  # first checkpoint where one group is ahead beyond the tolerance
    estimate_hours: float | None  # None: no crossing within the checkpoints
    ci_low_hours: float  # -inf: at or before the first checkpoint with a leader
    ci_high_hours: float  # +inf: not within the checkpoints
    level: float
    method: str
    first_separated_hours: float | None  # first checkpoint whose interval excludes 0, either way
    first_separated_leader: str | None  # the group ahead there
    crossings: list[Crossing]
    tie_tolerance: float
    paired: list[PairedPoint]
    tasks: list[str]  # the tasks both groups attempted: the only ones compared
    left_out: dict[str, list[str]]  # per group, tasks only that group attempted
    attempts: dict[str, int]  # per group, attempts on the compared tasks
    gap_hours: list[float]  # checkpoints without a paired value (one group has no data)
    crosses_gap: bool  # the first crossing's estimate interpolates across a gap
    note: str
    p_crossing: float  # share of paired bootstrap replicates where the late group ever leads
    p_crossing_mc_se: float  # its Monte Carlo standard error
    n_boot: int
    checkpoints: list[float]


def crossing_times(diff: FloatArray, hours: Sequence[float]) -> FloatArray:
    """First budget where each row of `diff` (late minus early leader) reaches 0.

    Linear interpolation in log-hours between the last negative and first non-negative
    checkpoint; -inf when already non-negative at the first checkpoint, +inf when never, NaN
    when a row has a missing value.
    """
    d = np.atleast_2d(diff)
    logs = np.log(np.asarray(hours, dtype=np.float64))
    ahead = d >= 0
    has = ahead.any(axis=1)
    idx = np.argmax(ahead, axis=1)
    out = np.full(d.shape[0], np.inf)
    out[has & (idx == 0)] = -np.inf
    inner = has & (idx > 0)
    rows = np.nonzero(inner)[0]
    i = idx[rows]
    d0, d1 = d[rows, i - 1], d[rows, i]
    frac = d0 / (d0 - d1)  # d0 < 0 <= d1
    out[rows] = np.exp(logs[i - 1] + frac * (logs[i] - logs[i - 1]))
    out[np.isnan(d).any(axis=1)] = np.nan
    return out


def _attempted(traj: pd.DataFrame, group: str) -> set[str]:
    rows = traj[(traj["group"] == group) & traj["value"].notna()]
    return set(rows["task"].unique())


def _lead_runs(state: list[int]) -> list[tuple[int, int, int]]:
    """(sign, first index, last index) of each run of one leader; ties (0) join no run, so a
    tie between two leads of the same group is no change of the leader."""
    runs: list[tuple[int, int, int]] = []
    for i, sign in enumerate(state):
        if sign == 0:
            continue
        if runs and runs[-1][0] == sign:
            runs[-1] = (sign, runs[-1][1], i)
        else:
            runs.append((sign, i, i))
    return runs


def _crossings(
    runs: list[tuple[int, int, int]],
    diff: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
    hours: list[float],
    names: dict[int, str],
    gap_hours: list[float],
) -> list[Crossing]:
    """Every change of the leader between consecutive lead runs. `diff`, `lo`, `hi` are late
    minus early (sign +1: late ahead); each crossing is read on the new leader minus the old,
    from the old leader's first checkpoint in front to the new leader's last."""
    out: list[Crossing] = []
    for old, new in itertools.pairwise(runs):
        sign = new[0]
        window = slice(old[1], new[2] + 1)
        seg_hours = hours[window]
        gain = sign * diff[window]
        low, high = (lo[window], hi[window]) if sign > 0 else (-hi[window], -lo[window])
        estimate = float(crossing_times(gain, seg_hours)[0])
        separated = [h for h, bound in zip(seg_hours, low, strict=True) if bound > 0]
        after = next(h for h in seg_hours if h >= estimate - _EPS)
        before = max((h for h in seg_hours if h < after), default=after)
        out.append(
            Crossing(
                from_leader=names[old[0]],
                to_leader=names[sign],
                estimate_hours=estimate,
                ci_low_hours=float(crossing_times(high, seg_hours)[0]),
                ci_high_hours=float(crossing_times(low, seg_hours)[0]),
                first_separated_hours=next((h for h in separated if h >= estimate), None),
                crosses_gap=any(before < g < after for g in gap_hours),
            )
        )
    return out


def crossover(
    traj: pd.DataFrame,
    group_a: str,
    group_b: str,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    tie_tolerance: float = TIE_TOLERANCE,
) -> CrossoverResult:
    """Who leads when, on the tasks both groups attempted, from paired per-task differences.

    A group leads at a checkpoint when the paired mean difference exceeds `tie_tolerance`;
    anything closer is a tie, and a tie is not a crossing (both groups at 1.0 have not crossed).
    Every change of the leader is a crossing, with its own interval. Raises ValueError where
    the comparison would mislead: fewer than MIN_SHARED_TASKS shared tasks, fewer than two
    checkpoints with a paired value, or curves that never differ by more than the tolerance.
    """
    if not math.isfinite(tie_tolerance) or tie_tolerance < 0:
        raise ValueError(f"the tie tolerance must be a number >= 0, got {tie_tolerance!r}")
    for group in (group_a, group_b):
        if group not in set(traj["group"]):
            raise ValueError(f"no trajectories for group {group!r}")
    own = {g: _attempted(traj, g) for g in (group_a, group_b)}
    tasks = sorted(own[group_a] & own[group_b])
    if len(tasks) < MIN_SHARED_TASKS:
        raise ValueError(
            f"{group_a} and {group_b} share {len(tasks)} scored task(s) "
            f"({len(own[group_a])} and {len(own[group_b])} in all); at least "
            f"{MIN_SHARED_TASKS} are needed to compare them"
        )
    all_hours = _checkpoints_of(traj)
    data = {g: nested(traj, g, tasks, all_hours) for g in (group_a, group_b)}
    per_task = {g: task_means(data[g].values) for g in data}
    # b minus a, over the tasks where both groups have a value at the checkpoint
    paired = paired_interval(per_task[group_a], per_task[group_b], level, bounds=score_range(traj))
    methods = paired.methods()
    usable = paired.n_tasks >= MIN_SHARED_TASKS
    some = ~np.isnan(per_task[group_a]).all(axis=0) | ~np.isnan(per_task[group_b]).all(axis=0)
    gap_hours = [all_hours[c] for c in np.nonzero(some & ~usable)[0]]
    keep = np.nonzero(usable)[0]
    if len(keep) < 2:
        raise ValueError(
            f"{group_a} and {group_b} share fewer than two checkpoints with scores on "
            f"{MIN_SHARED_TASKS} or more common tasks"
        )
    hours = [all_hours[c] for c in keep]
    differs = np.nonzero(np.abs(paired.mean[keep]) > tie_tolerance + _EPS)[0]
    if len(differs) == 0:
        raise ValueError(
            f"{group_a} and {group_b} are within {tie_tolerance:g} of each other at every shared "
            "checkpoint: neither leads"
        )
    first = int(differs[0])
    sign = 1.0 if paired.mean[keep][first] < 0 else -1.0  # +1: a leads early, b catches up
    early, late = (group_a, group_b) if sign > 0 else (group_b, group_a)
    diff = sign * paired.mean[keep]
    lo, hi = (
        (paired.lo[keep], paired.hi[keep]) if sign > 0 else (-paired.hi[keep], -paired.lo[keep])
    )
    state = [0 if abs(d) <= tie_tolerance + _EPS else (1 if d > 0 else -1) for d in diff]
    names = {1: late, -1: early}
    runs = _lead_runs(state)
    # Where every task has the same difference there is no interval to report, but the
    # difference itself is known: crossing times read it as its own bounds.
    tied = paired.tied[keep]
    lo_known, hi_known = np.where(tied, diff, lo), np.where(tied, diff, hi)
    crossings = _crossings(runs, diff, lo_known, hi_known, hours, names, gap_hours)
    separated = [
        (h, names[1] if low > 0 else names[-1])
        for h, low, high in zip(hours, lo, hi, strict=True)
        if low > 0 or high < 0
    ]
    window = hours[first:]

    rng = np.random.default_rng(seed)
    draws = draw_tasks(len(tasks), n_boot, rng)
    reps = (
        sign
        * (bootstrap_means(data[group_b], draws, rng) - bootstrap_means(data[group_a], draws, rng))[
            :, keep[first:]
        ]
    )
    complete = reps[~np.isnan(reps).any(axis=1)]
    p_crossing = (
        float((complete > tie_tolerance + _EPS).any(axis=1).mean()) if len(complete) else 0.0
    )

    if crossings:
        head = crossings[0]
        estimate, ci_low, ci_high = head.estimate_hours, head.ci_low_hours, head.ci_high_hours
        crosses_gap = head.crosses_gap
    else:
        estimate = None
        ci_low = float(crossing_times(hi_known[first:], window)[0])
        ci_high = float(crossing_times(lo_known[first:], window)[0])
        crosses_gap = False
    left_out = {g: sorted(own[g] - set(tasks)) for g in (group_a, group_b)}
    compared = traj[traj["task"].isin(tasks) & traj["value"].notna()]
    attempts = {
        g: int(compared.loc[compared["group"] == g, "attempt_id"].nunique())
        for g in (group_a, group_b)
    }
    return CrossoverResult(
        early_leader=early,
        late_leader=late,
        leader_from_hours=window[0],
        estimate_hours=estimate,
        ci_low_hours=ci_low,
        ci_high_hours=ci_high,
        level=level,
        method=PAIRED_METHOD,
        first_separated_hours=separated[0][0] if separated else None,
        first_separated_leader=separated[0][1] if separated else None,
        crossings=crossings,
        tie_tolerance=tie_tolerance,
        paired=[
            PairedPoint(
                hours=h,
                difference=float(d),
                lo=float(a),
                hi=float(b),
                n_tasks=int(paired.n_tasks[c]),
                method=str(methods[c]),
                leader=names[st] if st else None,
                separated=bool(a > 0 or b < 0),
            )
            for h, d, a, b, c, st in zip(hours, diff, lo, hi, keep, state, strict=True)
        ],
        tasks=tasks,
        left_out=left_out,
        attempts=attempts,
        gap_hours=gap_hours,
        crosses_gap=crosses_gap,
        note=_crossover_note(
            tasks, left_out, gap_hours, early, window[0], crossings, tie_tolerance, attempts
        ),
        p_crossing=p_crossing,
        p_crossing_mc_se=math.sqrt(p_crossing * (1 - p_crossing) / max(1, len(complete))),
        n_boot=n_boot,
        checkpoints=hours,
    )


def _crossover_note(
    tasks: list[str],
    left_out: dict[str, list[str]],
    gap_hours: list[float],
    early: str,
    leader_from: float,
    crossings: list[Crossing],
    tie_tolerance: float,
    attempts: dict[str, int],
) -> str:
    """What an analyst must know before quoting the crossover, in plain sentences."""
    runs = ", ".join(f"{g} {n}" for g, n in attempts.items())
    parts = [f"Compared on the {len(tasks)} tasks both groups attempted ({runs} attempts)"]
    dropped = [f"{len(t)} only {g}" for g, t in left_out.items() if t]
    if dropped:
        parts[0] += f"; left out: {', '.join(dropped)}"
    parts[0] += "."
    if len(tasks) < FEW_SHARED_TASKS:
        parts.append(
            f"Only {len(tasks)} tasks: intervals are wide and cover less than their level "
            "when scores are skewed."
        )
    parts.append(
        f"A group leads when ahead by more than {tie_tolerance:g}; closer is a tie, not a crossing."
    )
    parts.append(f"{early} ahead from {leader_from:g} h (the first checkpoint with a leader).")
    if not crossings:
        parts.append("The lead never changes within the checkpoints.")
    for number, c in enumerate(crossings, start=1):
        gap = " (interpolated across a checkpoint without data)" if c.crosses_gap else ""
        parts.append(
            f"Crossing {number} of {len(crossings)}: {c.to_leader} overtakes {c.from_leader} "
            f"at about {c.estimate_hours:.2g} h{gap}."
        )
    if gap_hours:
        hours = ", ".join(f"{h:g} h" for h in gap_hours)
        parts.append(f"No paired value at {hours} (a group has no data there): not used.")
    parts.append(f"Paired intervals: {PAIRED_METHOD}.")
    return " ".join(parts)


# -- cost and breakdowns -----------------------------------------------------------------------


def score_vs_cost(traj: pd.DataFrame, curves: pd.DataFrame, hourly_rate: float) -> pd.DataFrame:
    """Group means against mean cost per attempt at each checkpoint.

    Humans cost `hourly_rate` per working hour; agents cost their API calls from the ledger up
    to the snapshot (agents with no ledger rows show NaN cost, not a free run).
    """
    if not math.isfinite(hourly_rate) or hourly_rate < 0:
        raise ValueError(f"hourly rate must be a number >= 0, got {hourly_rate!r}")
    rows: list[dict[str, Any]] = []
    for (group, h), at in traj.groupby(["group", "checkpoint_hours"]):
        human = bool((at["participant_kind"] == "human").all())
        cost = float(h) * hourly_rate if human else float(at["api_cost_usd"].mean())
        curve = curves[(curves["group"] == group) & (curves["checkpoint_hours"] == h)]
        if curve.empty:
            continue
        mean, lo, hi = (float(curve[c].iloc[0]) for c in ("mean", "lo", "hi"))
        rows.append(
            {
                "group": group,
                "checkpoint_hours": float(h),
                "cost_usd": cost,
                "mean": mean,
                "lo": lo,
                "hi": hi,
                "score_per_100_usd": mean / cost * 100 if cost and cost > 0 else math.nan,
            }
        )
    return pd.DataFrame(rows)


def sub_score_names(traj: pd.DataFrame, prefix: str) -> list[str]:
    return sorted(c for c in traj.columns if c.startswith(prefix))


def breakdown(traj: pd.DataFrame, prefix: str, *, level: float = 0.95) -> pd.DataFrame:
    """Group curves of every sub-score with this prefix ("cat:" or "stage:")."""
    frames = []
    for column in sub_score_names(traj, prefix):
        if traj[column].notna().any():
            curves = group_curves(traj, column=column, level=level)
            curves.insert(1, "name", column[len(prefix) :])
            frames.append(curves)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def failure_classes(traj: pd.DataFrame) -> pd.DataFrame:
    """Reproductions per group and failure class, with their share and mean score."""
    rows = traj[traj["reproduction_status"].notna()].copy()
    if rows.empty:
        return pd.DataFrame(columns=["group", "failure_class", "count", "share", "mean_score"])
    failed = rows["reproduction_failed"].astype(bool)
    rows["failure_class"] = np.where(
        rows["failure_class"].notna(),
        rows["failure_class"],
        np.where(failed, "unclassified failure", "succeeded"),
    )
    out = (
        rows.groupby(["group", "failure_class"])
        .agg(count=("attempt_id", "size"), mean_score=("value", "mean"))
        .reset_index()
    )
    out["share"] = out["count"] / out.groupby("group")["count"].transform("sum")
    return out
