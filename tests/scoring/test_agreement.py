"""Agreement statistics against scikit-learn (Cohen) and a published worked example (Fleiss)."""

from __future__ import annotations

import random

import pytest
from sklearn.metrics import cohen_kappa_score

from scoring.agreement import agreement, cohen_kappa, fleiss_kappa, percent_agreement


@pytest.mark.parametrize("seed", range(20))
def test_cohen_kappa_equals_sklearn(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(5, 60)
    a = [rng.randint(0, 1) for _ in range(n)]
    b = [x if rng.random() < 0.7 else 1 - x for x in a]
    if len(set(a) | set(b)) == 1:
        b[0] = 1 - b[0]
    assert cohen_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b))


def test_fleiss_kappa_worked_example() -> None:
    """Fleiss (1971) as reproduced on Wikipedia: 10 items, 14 raters, 5 categories: 0.210."""
    table = [
        [0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7],
    ]  # fmt: skip
    items = [[c for c, n in enumerate(row) for _ in range(n)] for row in table]
    assert fleiss_kappa(items) == pytest.approx(0.2099, abs=1e-4)


def test_two_raters_fleiss_and_percent() -> None:
    items = [[1, 1], [0, 0], [1, 0], [0, 0]]
    assert percent_agreement(items) == 0.75
    assert fleiss_kappa(items) is not None
    assert percent_agreement([[1]]) is None and fleiss_kappa([[1]]) is None


def test_agreement_summary_per_pair() -> None:
    grades = {
        "s1:0.0": {"g1": 1, "g2": 1, "g3": 0},
        "s1:0.1": {"g1": 0, "g2": 0},
        "s1:0.2": {"g1": 1},  # one grader only: not an agreement item
    }
    result = agreement(grades)
    assert result.items == 2 and result.ratings == 5
    assert result.percent == pytest.approx(2 / 4)
    pairs = {(p.grader_a, p.grader_b): p for p in result.pairs}
    assert pairs[("g1", "g2")].items == 2 and pairs[("g1", "g2")].percent == 1.0
    assert pairs[("g1", "g3")].items == 1 and pairs[("g1", "g3")].percent == 0.0
