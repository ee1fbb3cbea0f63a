"""Coverage of the default 95% interval on the score shapes real studies produce (issue 37).

One value per task (the task-level mean a study's interval is built from), drawn from each
shape, S studies per cell (seeded), the interval of `analysis.intervals.task_interval` with the
known range [0, 1] for the bounded shapes. Shapes built from attempts are drawn with 1, 4 and 8
attempts per task (the task value is the mean of its attempts). Printed per shape and number of
tasks: coverage of the true mean and the median width over the plain t-interval's (where the t
has a width), with the share of studies given an interval where not all are, and the share of
zero-width intervals if there are any (there must be none). The target (issue 37): coverage
within [0.93, 0.975] at 3 or more tasks, width at most 1.1x the t where the t is valid; the
binomial standard error of a coverage is sqrt(0.95 * 0.05 / S), 0.0015 at S = 20,000.

A second table: paired differences between two groups on the same tasks (the crossover's and
the planner's interval, `analysis.intervals.paired_interval`), the groups' task values linked by
a Gaussian copula (correlation 0.7: a task hard for one group is hard for the other); coverage
and median width over the plain t on the differences, the plain t's coverage in brackets.

Usage: python benchmarks/coverage_shapes.py [STUDIES]   (default 20000, about a minute)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.intervals import paired_interval, task_interval
from tests.analysis.score_shapes import PAIRS, RHO, SHAPES, TASKS


def main(studies: int) -> None:
    print(f"{studies} studies per cell; cell: coverage / median width over the plain t")
    print(f"{'shape':34s}" + "".join(f"{n:>19d} tasks" for n in TASKS))
    for shape in SHAPES:
        cells = []
        for n in TASKS:
            x = shape.draw(np.random.default_rng([37, n]), studies, n)
            got = task_interval(x[:, :, None], bounds=shape.bounds)
            lo, hi = got.lo[:, 0], got.hi[:, 0]
            shown = ~np.isnan(lo)
            covered = float(((lo <= shape.truth) & (shape.truth <= hi))[shown].mean())
            t_width = 2 * stats.t.ppf(0.975, n - 1) * x.std(axis=1, ddof=1) / np.sqrt(n)
            has = shown & (t_width > 0)
            ratio = float(np.median((hi - lo)[has] / t_width[has]))
            cell = f"{covered:.3f} {ratio:.2f}x"
            if not shown.all():
                cell += f" ({shown.mean():.0%} given)"
            if ((hi - lo)[shown] <= 0).any():
                cell += f" ZERO-WIDTH {((hi - lo)[shown] <= 0).mean():.1%}"
            cells.append(cell)
        print(f"{shape.name:34s}" + "".join(f"{c:>25s}" for c in cells))

    print(f"\npaired differences, copula correlation {RHO}; cell: coverage / width (plain t's)")
    print(f"{'pair':34s}" + "".join(f"{n:>15d} tasks  " for n in TASKS))
    for pair in PAIRS:
        cells = []
        for n in TASKS:
            a, b = pair.draw(np.random.default_rng([38, n]), studies, n)
            diff = b - a
            got = paired_interval(a[:, :, None], b[:, :, None], bounds=pair.bounds)
            lo, hi = got.lo[:, 0], got.hi[:, 0]
            shown = ~np.isnan(lo)
            covered = float(((lo <= pair.truth) & (pair.truth <= hi))[shown].mean())
            half = stats.t.ppf(0.975, n - 1) * diff.std(axis=1, ddof=1) / np.sqrt(n)
            centre = diff.mean(axis=1)
            plain = float(((centre - half <= pair.truth) & (pair.truth <= centre + half)).mean())
            has = shown & (half > 0)
            ratio = float(np.median((hi - lo)[has] / (2 * half[has])))
            cells.append(f"{covered:.3f} {ratio:.2f}x ({plain:.3f})")
        print(f"{pair.name:34s}" + "".join(f"{c:>22s}" for c in cells))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
