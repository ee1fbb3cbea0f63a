"""Coverage of the default 95% interval on the score shapes issue 37 names, as it stands.

One value per task (the task-level mean a study's interval is built from), drawn from each
shape, S studies per cell (seeded), the interval of `analysis.intervals.task_interval` with the
known range [0, 1] for the bounded shapes. Printed per shape and number of tasks: coverage of
the true mean, the median width over the plain t-interval's (where the t has a width), and the
share of studies given an interval at all. The target (issue 37): coverage within [0.93, 0.975]
at 3 or more tasks, width at most 1.1x the t where the t is valid; the binomial standard error of
a coverage is sqrt(0.95 * 0.05 / S), 0.0015 at S = 20,000.

Usage: python benchmarks/coverage_shapes.py [STUDIES]   (default 20000, about 10 s)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.bootstrap import FloatArray
from analysis.intervals import task_interval

TASKS = (3, 5, 10, 20, 40)
Draw = Callable[[np.random.Generator, int, int], FloatArray]


def _zero_inflated(rng: np.random.Generator, s: int, n: int) -> FloatArray:
    """60% of tasks exactly 0, the rest high (beta(8, 2)): EXP-Bench / early PaperBench."""
    return np.where(rng.random((s, n)) < 0.6, 0.0, rng.beta(8.0, 2.0, (s, n)))


SHAPES: tuple[tuple[str, Draw, float, tuple[float, float] | None], ...] = (
    ("zero-inflated bimodal", _zero_inflated, 0.4 * 0.8, (0.0, 1.0)),
    ("beta(0.5, 3)", lambda rng, s, n: rng.beta(0.5, 3.0, (s, n)), 0.5 / 3.5, (0.0, 1.0)),
    ("beta(2, 2)", lambda rng, s, n: rng.beta(2.0, 2.0, (s, n)), 0.5, (0.0, 1.0)),
    ("lognormal sd 0.8", lambda rng, s, n: np.exp(rng.normal(-0.32, 0.8, (s, n))), 1.0, None),
    ("lognormal sd 1.2", lambda rng, s, n: np.exp(rng.normal(-0.72, 1.2, (s, n))), 1.0, None),
)


def main(studies: int) -> None:
    rng = np.random.default_rng(37)
    print(f"{studies} studies per cell; cell: coverage / median width over the plain t")
    print(f"{'shape':24s}" + "".join(f"{n:>16d} tasks" for n in TASKS))
    for name, draw, truth, bounds in SHAPES:
        cells = []
        for n in TASKS:
            x = draw(rng, studies, n)
            got = task_interval(x[:, :, None], bounds=bounds)
            lo, hi = got.lo[:, 0], got.hi[:, 0]
            shown = ~np.isnan(lo)
            covered = float(((lo <= truth) & (truth <= hi))[shown].mean())
            sd = x.std(axis=1, ddof=1)
            t_width = 2 * stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)
            has = shown & (t_width > 0)
            ratio = float(np.median((hi - lo)[has] / t_width[has]))
            given = "" if shown.all() else f" ({shown.mean():.0%} given)"
            cells.append(f"{covered:.3f} / {ratio:.2f}x{given}")
        print(f"{name:24s}" + "".join(f"{c:>22s}" for c in cells))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
