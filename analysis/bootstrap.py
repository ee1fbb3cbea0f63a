"""Hierarchical bootstrap of group means over tasks and attempts, vectorised with numpy.

The estimand is the mean over tasks of each task's mean attempt score (every task weighs the
same, as in RE-Bench and PaperBench). Uncertainty comes from both levels of sampling, so each
bootstrap replicate resamples tasks with replacement, then attempts with replacement within each
drawn task. Task draws can be shared between groups (`task_draws`) so that the difference between
two groups measured on the same tasks is resampled as a paired quantity.

Intervals are not read from these replicates any more (`analysis.intervals` explains why: with 2
or 3 tasks the percentile tails are the min-max of the replicates). They serve the crossover's
share of replicates that cross within the checkpoints, a quantity with no closed form.

Data layout: ``values[T, N, C]`` holds task t's attempt n at checkpoint c, NaN where missing or
where the task has fewer than N attempts; ``counts[T]`` is the number of attempts of each task.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# Upper bound on the elements of one gathered block; keeps memory near 200 MB at float64.
_BLOCK_ELEMENTS = 25_000_000


@dataclass(frozen=True)
class Nested:
    """One group's scores, nested as tasks x attempts x checkpoints (NaN-padded)."""

    values: FloatArray
    counts: IntArray

    def __post_init__(self) -> None:
        if self.values.ndim != 3:
            raise ValueError("values must be a [tasks, attempts, checkpoints] array")
        if self.counts.shape != (self.values.shape[0],):
            raise ValueError("counts must hold one attempt count per task")
        if np.any(self.counts > self.values.shape[1]) or np.any(self.counts < 0):
            raise ValueError("an attempt count exceeds the attempts axis or is negative")


def task_means(values: FloatArray) -> FloatArray:
    """Mean over the attempts axis of a [..., attempts, checkpoints] array, ignoring NaN.

    NaN where a task has no value at a checkpoint: missing stays missing, never 0.
    """
    present = ~np.isnan(values)
    total = np.where(present, values, 0.0).sum(axis=-2)
    n = present.sum(axis=-2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def _mean_over_tasks(means: FloatArray, axis: int) -> FloatArray:
    present = ~np.isnan(means)
    total = np.where(present, means, 0.0).sum(axis=axis)
    n = present.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def point_estimate(data: Nested) -> FloatArray:
    """The group mean at each checkpoint: mean over tasks of the task means."""
    return _mean_over_tasks(task_means(data.values), axis=0)


def draw_tasks(n_tasks: int, n_boot: int, rng: np.random.Generator) -> IntArray:
    """Task indices of every replicate, [n_boot, n_tasks]; share them to pair groups."""
    return rng.integers(0, n_tasks, size=(n_boot, n_tasks), dtype=np.int64)


def bootstrap_means(data: Nested, task_draws: IntArray, rng: np.random.Generator) -> FloatArray:
    """Replicates of the group mean, [n_boot, checkpoints].

    A task drawn with no attempts contributes nothing to its replicate (as a task without
    attempts contributes nothing to the point estimate); a replicate with no value at a
    checkpoint is NaN there.
    """
    values, counts = data.values, data.counts
    n_boot, n_drawn = task_draws.shape
    n_tasks, n_max, n_check = values.shape
    if n_tasks == 0 or n_max == 0:
        return np.full((n_boot, n_check), np.nan)
    # Each task gets one extra, empty attempt (sum 0, present 0) and its rows hold the values
    # (NaN as 0) next to their presence: slots beyond a task's own count point at the empty
    # attempt, so one gather and one sum over attempts give every resampled task's total and
    # count, with no NaN masking pass over the gathered block.
    present = ~np.isnan(values)
    stacked = np.zeros((n_tasks, n_max + 1, 2 * n_check))
    stacked[:, :n_max, :n_check] = np.where(present, values, 0.0)
    stacked[:, :n_max, n_check:] = present
    flat = stacked.reshape(n_tasks * (n_max + 1), 2 * n_check)
    per_replicate = max(1, n_drawn * n_max * 2 * n_check)
    block = max(1, _BLOCK_ELEMENTS // per_replicate)
    slots = np.arange(n_max)
    out = np.empty((n_boot, n_check))
    for start in range(0, n_boot, block):
        tasks = task_draws[start : start + block]  # [b, T]
        n = counts[tasks][..., None]  # [b, T, 1]
        # Attempt j of a drawn task is uniform over that task's attempts, so each task is
        # resampled at its own size.
        picks = (rng.random((*tasks.shape, n_max)) * n).astype(np.int64)
        rows = tasks[..., None] * (n_max + 1) + np.where(slots < n, picks, n_max)
        summed = flat[rows].sum(axis=2)  # [b, T, 2C]
        total, used = summed[..., :n_check], summed[..., n_check:]
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(used > 0, total / np.maximum(used, 1), np.nan)
        out[start : start + block] = _mean_over_tasks(means, axis=1)
    return out


def bootstrap_loop(data: Nested, task_draws: IntArray, rng: np.random.Generator) -> FloatArray:
    """The same resampling written as plain Python loops: the benchmark's reference point."""
    values, counts = data.values, data.counts
    n_boot = task_draws.shape[0]
    n_check = values.shape[2]
    out = np.full((n_boot, n_check), np.nan)
    for b in range(n_boot):
        for c in range(n_check):
            means: list[float] = []
            for t in task_draws[b]:
                n = int(counts[t])
                picked = [values[t, int(rng.random() * n), c] for _ in range(n)]
                present = [v for v in picked if not np.isnan(v)]
                if present:
                    means.append(sum(present) / len(present))
            if means:
                out[b, c] = sum(means) / len(means)
    return out
