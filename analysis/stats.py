"""Trajectories, group curves with hierarchical bootstrap intervals, best-of-k, crossover, cost.

Methods, in the words a figure caption can repeat:
- A trajectory is an attempt's score at each checkpoint. For scored tasks (``best_so_far``) it is
  the best usable score logged by then (RE-Bench's rule); for paper tasks it is the grading of
  the checkpoint's snapshot.
- Missing points stay missing (NaN with a reason). ``carry_forward=True`` fills the checkpoints
  after an attempt ended with its last usable score and marks them ``carried_forward``.
- A group curve is the mean over tasks of the per-task mean attempt score, with an expanded
  percentile interval (`analysis.bootstrap.expanded_tail`) from a hierarchical bootstrap (tasks,
  then attempts within task).
- Best-of-k is the expected maximum of k runs drawn from a task's runs, exactly from order
  statistics, or by resampling.
- The crossover is the budget at which the group behind at the first checkpoint catches up,
  interpolated linearly in log-hours between checkpoints; its interval is the percentile
  interval of the same quantity over bootstrap replicates (which may fall before the first or
  after the last checkpoint). The budget at which the later leader's interval first lies wholly
  above the other's is reported too (``first_separated_hours``).
"""

from __future__ import annotations

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
    expanded_tail,
    percentile_interval,
    point_estimate,
    units_per_checkpoint,
)
from analysis.missing import MissingReason, PointState

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
    "missing",
    "api_cost_usd",
    "reproduction_status",
    "failure_class",
    "reproduction_failed",
    "synthetic",
)
_EPS = 1e-9


def default_checkpoints(table: pd.DataFrame) -> list[float]:
    hours = table["checkpoint_hours"].dropna()
    return sorted(float(h) for h in hours.unique() if h > 0)


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


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
                point.update({c: at_row[c] for c in sub_columns})
        ended = point["missing"] == MissingReason.ENDED_EARLY.value
        if scored and not ended:
            before = [r["score"] for r in usable if r["working_hours"] <= h + _EPS]
            if before:
                best = float(max(before))
                if point["state"] != PointState.OBSERVED.value or best > point["value"]:
                    point.update(value=best, state=PointState.BEST_SO_FAR.value)
        if ended and carry_forward and usable:
            last = max(r["score"] for r in usable) if scored else usable[-1]["score"]
            point.update(value=float(last), state=PointState.CARRIED_FORWARD.value)
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


def group_curves(
    traj: pd.DataFrame,
    *,
    column: str = "value",
    groups: Sequence[str] | None = None,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Mean and bootstrap interval per group and checkpoint, with counts of what was used."""
    chosen = list(groups) if groups is not None else sorted(traj["group"].unique())
    tasks = sorted(traj["task"].unique())
    hours = _checkpoints_of(traj)
    rng = np.random.default_rng(seed)
    draws = draw_tasks(len(tasks), n_boot, rng)
    rows: list[dict[str, Any]] = []
    for group in chosen:
        data = nested(traj, group, tasks, hours, column)
        est = point_estimate(data)
        reps = bootstrap_means(data, draws, rng)
        lo, hi = percentile_interval(reps, level, units_per_checkpoint(data))
        sub = traj[traj["group"] == group]
        for c, h in enumerate(hours):
            at = sub[sub["checkpoint_hours"] == h]
            used = at[at[column].notna()]
            rows.append(
                {
                    "group": group,
                    "checkpoint_hours": h,
                    "mean": est[c],
                    "lo": lo[c],
                    "hi": hi[c],
                    "n_tasks": int(used["task"].nunique()),
                    "n_values": len(used),
                    "n_missing": int(at[column].isna().sum()),
                    "n_carried": int((used["state"] == PointState.CARRIED_FORWARD.value).sum()),
                }
            )
    return pd.DataFrame(rows)


# -- best-of-k ---------------------------------------------------------------------------------


def expected_max_exact(scores: Sequence[float], k: int, *, replace: bool = True) -> float:
    """E[max of k runs] over the empirical distribution of `scores`, from order statistics.

    With replacement: P(max <= x_(i)) = (i/n)^k. Without: P(max = x_(i)) = C(i-1, k-1) / C(n, k).
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
    replace: bool = True,
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


def best_of_k(
    traj: pd.DataFrame,
    ks: Sequence[int],
    *,
    groups: Sequence[str] | None = None,
    replace: bool = True,
) -> pd.DataFrame:
    """Expected best of k runs per group, run length (checkpoint) and total budget k x hours.

    Computed per task from that task's runs, then averaged over tasks (tasks weigh the same).
    """
    chosen = list(groups) if groups is not None else sorted(traj["group"].unique())
    rows: list[dict[str, Any]] = []
    for group in chosen:
        sub = traj[(traj["group"] == group) & traj["value"].notna()]
        for h, at in sub.groupby("checkpoint_hours"):
            for k in ks:
                per_task = [
                    expected_max_exact(v["value"].tolist(), k, replace=replace)
                    for _, v in at.groupby("task")
                ]
                usable = [p for p in per_task if not math.isnan(p)]
                rows.append(
                    {
                        "group": group,
                        "k": k,
                        "run_hours": float(h),
                        "budget_hours": k * float(h),
                        "expected_max": float(np.mean(usable)) if usable else math.nan,
                        "n_tasks": len(usable),
                    }
                )
    return pd.DataFrame(rows)


# -- crossover ---------------------------------------------------------------------------------


class CrossoverResult(BaseModel):
    """When the group behind at the start catches up, with a bootstrap interval."""

    early_leader: str
    late_leader: str
    estimate_hours: float | None  # None: no crossing within the checkpoints
    ci_low_hours: float  # -inf: before the first checkpoint; +inf: after the last
    ci_high_hours: float
    level: float
    p_crossing: float  # share of replicates with a crossing inside the checkpoint range
    first_separated_hours: float | None
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


def crossover(
    traj: pd.DataFrame,
    group_a: str,
    group_b: str,
    *,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> CrossoverResult:
    """Crossover of two groups' curves (paired bootstrap: the same task draws for both)."""
    for group in (group_a, group_b):
        if group not in set(traj["group"]):
            raise ValueError(f"no trajectories for group {group!r}")
    tasks = sorted(traj["task"].unique())
    all_hours = _checkpoints_of(traj)
    data_a = nested(traj, group_a, tasks, all_hours)
    data_b = nested(traj, group_b, tasks, all_hours)
    est_a, est_b = point_estimate(data_a), point_estimate(data_b)
    both = ~np.isnan(est_a) & ~np.isnan(est_b)
    if both.sum() < 2:
        raise ValueError("the two groups share fewer than two checkpoints with scores")
    keep = np.nonzero(both)[0]
    hours = [all_hours[i] for i in keep]
    if est_a[keep[0]] >= est_b[keep[0]]:
        early, late, est_e, est_l, data_e, data_l = group_a, group_b, est_a, est_b, data_a, data_b
    else:
        early, late, est_e, est_l, data_e, data_l = group_b, group_a, est_b, est_a, data_b, data_a
    rng = np.random.default_rng(seed)
    draws = draw_tasks(len(tasks), n_boot, rng)
    reps_e = bootstrap_means(data_e, draws, rng)[:, keep]
    reps_l = bootstrap_means(data_l, draws, rng)[:, keep]
    point = float(crossing_times((est_l - est_e)[keep], hours)[0])
    times = crossing_times(reps_l - reps_e, hours)
    times = times[~np.isnan(times)]
    units = min(
        int(units_per_checkpoint(data_e)[keep].min()), int(units_per_checkpoint(data_l)[keep].min())
    )
    tail = expanded_tail(units, level)
    if len(times) and not math.isnan(tail):
        low, high = np.quantile(times, [tail, 1 - tail], method="inverted_cdf")
    else:
        low, high = -math.inf, math.inf
    _, hi_e = percentile_interval(reps_e, level, units_per_checkpoint(data_e)[keep])
    lo_l, _ = percentile_interval(reps_l, level, units_per_checkpoint(data_l)[keep])
    separated = np.nonzero(lo_l > hi_e)[0]
    return CrossoverResult(
        early_leader=early,
        late_leader=late,
        estimate_hours=point if math.isfinite(point) else None,
        ci_low_hours=float(low),
        ci_high_hours=float(high),
        level=level,
        p_crossing=float(np.isfinite(times).mean()) if len(times) else 0.0,
        first_separated_hours=float(hours[separated[0]]) if len(separated) else None,
        n_boot=n_boot,
        checkpoints=hours,
    )


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


def breakdown(
    traj: pd.DataFrame,
    prefix: str,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Group curves of every sub-score with this prefix ("cat:" or "stage:")."""
    frames = []
    for column in sub_score_names(traj, prefix):
        if traj[column].notna().any():
            curves = group_curves(traj, column=column, n_boot=n_boot, level=level, seed=seed)
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
