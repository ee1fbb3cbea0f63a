"""Coverage of 95% intervals over tasks: the study behind the default in `analysis.intervals`.

Simulates S studies per case (vectorised, seeded) from three score models, each with
heterogeneous tasks, 2 to 4 attempts per task and 7 checkpoints, and prints, per method, the
coverage of the true mean at each checkpoint as "mean over checkpoints [lowest-highest]":

- lognormal: normalised scores growing from 0.02 to 1.2; task, task x checkpoint, attempt and
  attempt x checkpoint effects multiplicative (lognormal, mean 1); task sd 0.1 to 0.8.
- rubric: PaperBench-like rubric fractions in [0, 1]: logistic in a checkpoint's progress minus
  a task's difficulty (sd tau on the logit scale) plus attempt noise; right-skewed early, left-
  skewed near the ceiling.
- zero-start: RE-Bench-like best-so-far scores that are exactly 0 until an attempt beats the
  starting solution (chance per task and checkpoint), then a lognormal gain.

Methods: plain t over task means; Hall's skew-corrected t (the previous default); the default
(the profile-likelihood interval for a log-normal mean where every task value is above 0, else the
skew-corrected t; with a known range the rules of `analysis.intervals`).

Usage: python benchmarks/coverage_study.py [STUDIES]   (default 4000, about a minute)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import special, stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.bootstrap import FloatArray
from analysis.intervals import task_interval

CHECKPOINTS = 7
ATTEMPTS = 4
GROWTH = np.array([0.02, 0.05, 0.10, 0.30, 0.60, 0.90, 1.20])
PROGRESS = special.logit(np.array([0.03, 0.06, 0.12, 0.25, 0.40, 0.55, 0.65]))
SUCCESS = special.logit(np.array([0.10, 0.25, 0.40, 0.55, 0.65, 0.75, 0.80]))
Model = Callable[[np.random.Generator, int, int, float], FloatArray]


def _lognormal(rng: np.random.Generator, sd: float, shape: tuple[int, ...]) -> FloatArray:
    return np.exp(rng.normal(-(sd**2) / 2, sd, shape))


def lognormal(rng: np.random.Generator, studies: int, n: int, task_sd: float) -> FloatArray:
    return (
        GROWTH
        * _lognormal(rng, task_sd, (studies, n, 1, 1))
        * _lognormal(rng, 0.1, (studies, n, 1, CHECKPOINTS))
        * _lognormal(rng, 0.3, (studies, n, ATTEMPTS, 1))
        * _lognormal(rng, 0.2, (studies, n, ATTEMPTS, CHECKPOINTS))
    )


def rubric(rng: np.random.Generator, studies: int, n: int, tau: float) -> FloatArray:
    logit = (
        PROGRESS
        - rng.normal(0, tau, (studies, n, 1, 1))
        + rng.normal(0, 0.3, (studies, n, 1, CHECKPOINTS))
        + rng.normal(0, 0.5, (studies, n, ATTEMPTS, 1))
        + rng.normal(0, 0.3, (studies, n, ATTEMPTS, CHECKPOINTS))
    )
    return np.asarray(special.expit(logit))


def zero_start(rng: np.random.Generator, studies: int, n: int, tau: float) -> FloatArray:
    chance = special.expit(
        SUCCESS
        - rng.normal(0, tau, (studies, n, 1, 1))
        + rng.normal(0, 0.3, (studies, n, 1, CHECKPOINTS))
    )
    beaten = rng.random((studies, n, ATTEMPTS, CHECKPOINTS)) < chance
    gain = (
        2
        * GROWTH
        * _lognormal(rng, 0.5, (studies, n, 1, 1))
        * _lognormal(rng, 0.3, (studies, n, ATTEMPTS, 1))
        * _lognormal(rng, 0.2, (studies, n, ATTEMPTS, CHECKPOINTS))
    )
    return np.maximum.accumulate(np.where(beaten, gain, 0.0), axis=-1)


def true_mean(model: Model, parameter: float) -> FloatArray:
    """The population mean per checkpoint, from 1,000,000 independent (task, attempt) draws."""
    rng = np.random.default_rng(12345)
    return np.mean([model(rng, 50_000, 1, parameter)[:, 0, 0].mean(axis=0) for _ in range(20)], 0)


def task_means(model: Model, parameter: float, studies: int, n: int, seed: int) -> FloatArray:
    rng = np.random.default_rng(seed)
    scores = np.array(
        np.broadcast_to(model(rng, studies, n, parameter), (studies, n, ATTEMPTS, CHECKPOINTS))
    )
    counts = rng.integers(2, ATTEMPTS + 1, size=(studies, n))
    dropped = np.arange(ATTEMPTS)[None, None, :, None] >= counts[..., None, None]
    scores[np.broadcast_to(dropped, scores.shape)] = np.nan
    return np.nanmean(scores, axis=2)


def plain_t(x: FloatArray) -> tuple[FloatArray, FloatArray]:
    n = x.shape[1]
    half = stats.t.ppf(0.975, n - 1) * x.std(axis=1, ddof=1) / math.sqrt(n)
    return x.mean(axis=1) - half, x.mean(axis=1) + half


def skew_t(x: FloatArray) -> tuple[FloatArray, FloatArray]:
    got = task_interval(x, log_scale=False) if x.shape[1] > 2 else None
    return (got.lo, got.hi) if got else plain_t(x)


def default(x: FloatArray) -> tuple[FloatArray, FloatArray]:
    got = task_interval(x)
    return got.lo, got.hi


METHODS = {"plain t": plain_t, "skew-corrected t": skew_t, "default": default}
MODELS: list[tuple[str, Model, float]] = [
    *(("lognormal sd", lognormal, sd) for sd in (0.1, 0.25, 0.35, 0.8)),
    *(("rubric tau", rubric, tau) for tau in (0.5, 1.0, 1.5)),
    ("zero-start tau", zero_start, 1.0),
]


def main() -> None:
    studies = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    se = math.sqrt(0.95 * 0.05 / studies)
    print(f"{studies} studies per case; binomial SE of one coverage {se:.4f}")
    print("model            tasks  " + "  ".join(f"{m:<20s}" for m in METHODS))
    for name, model, parameter in MODELS:
        truth = true_mean(model, parameter)
        for n in (2, 3, 5, 10):
            x = task_means(model, parameter, studies, n, seed=100 * n + int(100 * parameter))
            cells = []
            for method in METHODS.values():
                lo, hi = method(x)
                if np.all(np.isnan(lo)):
                    cells.append(f"{'no interval':<20s}")
                    continue
                cover = np.mean((lo <= truth) & (truth <= hi), axis=0)
                cells.append(f"{cover.mean():.3f} [{cover.min():.3f}-{cover.max():.3f}]")
            print(f"{name} {parameter:<4g}  {n:>5d}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
