"""Hierarchical bootstrap: 10,000 resamples over 1,000 trajectories, vectorised vs a plain loop.

1,000 trajectories = 50 tasks x 20 attempts, each scored at 7 checkpoints (5% missing). The
vectorised version (analysis.bootstrap.bootstrap_means) runs all 10,000 resamples. The plain
Python loop (analysis.bootstrap.bootstrap_loop, same resampling scheme) is timed on a subset of
the resamples and extrapolated linearly to 10,000 (its cost is linear in the resample count);
the output says how many it ran. Both share the same task draws.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.bootstrap import Nested, bootstrap_loop, bootstrap_means, draw_tasks

TASKS, ATTEMPTS, CHECKPOINTS = 50, 20, 7
RESAMPLES = 10_000
LOOP_SUBSET = 40


def main() -> None:
    rng = np.random.default_rng(0)
    values = rng.gamma(2.0, 0.2, size=(TASKS, ATTEMPTS, CHECKPOINTS))
    values[rng.random(values.shape) < 0.05] = np.nan
    data = Nested(values=values, counts=np.full(TASKS, ATTEMPTS, dtype=np.int64))
    draws = draw_tasks(TASKS, RESAMPLES, np.random.default_rng(1))

    start = time.perf_counter()
    fast = bootstrap_means(data, draws, np.random.default_rng(2))
    vectorised = time.perf_counter() - start

    start = time.perf_counter()
    slow = bootstrap_loop(data, draws[:LOOP_SUBSET], np.random.default_rng(2))
    loop_subset = time.perf_counter() - start
    loop_full = loop_subset * RESAMPLES / LOOP_SUBSET

    gap = float(np.max(np.abs(fast.mean(axis=0) - slow.mean(axis=0))))
    print(
        f"data: {TASKS * ATTEMPTS} trajectories ({TASKS} tasks x {ATTEMPTS} attempts), "
        f"{CHECKPOINTS} checkpoints"
    )
    print(f"vectorised: {RESAMPLES} resamples in {vectorised:.2f} s")
    print(
        f"plain loop: {LOOP_SUBSET} resamples in {loop_subset:.2f} s, "
        f"extrapolated to {RESAMPLES}: {loop_full:.0f} s"
    )
    print(f"speed-up (plain loop / vectorised): {loop_full / vectorised:.0f}x")
    print(f"sanity: largest gap between the two replicate means {gap:.4f} (sampling noise)")


if __name__ == "__main__":
    main()
