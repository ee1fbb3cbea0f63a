"""Agreement between graders who graded the same rubric leaves (0/1), for coordinators.

Why several statistics: raw percent agreement is easy to read but inflated when almost every leaf
gets the same grade; Cohen's kappa corrects for chance between two graders; Fleiss' kappa does so
for any number of graders per leaf (here in its usual form for a varying number of raters per item:
each item's agreement is weighted equally and the category shares pool every rating).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations


def percent_agreement(items: Sequence[Sequence[Hashable]]) -> float | None:
    """Share of agreeing pairs of ratings over items rated at least twice (None: no such item)."""
    agree = pairs = 0
    for ratings in items:
        for a, b in combinations(ratings, 2):
            pairs += 1
            agree += a == b
    return None if pairs == 0 else agree / pairs


def cohen_kappa(a: Sequence[Hashable], b: Sequence[Hashable]) -> float | None:
    """Cohen's kappa of two graders over the same items; None when undefined (no items)."""
    if len(a) != len(b):
        raise ValueError("both graders must rate the same items")
    n = len(a)
    if n == 0:
        return None
    observed = sum(x == y for x, y in zip(a, b, strict=True)) / n
    count_a, count_b = Counter(a), Counter(b)
    expected = sum(count_a[c] * count_b[c] for c in set(a) | set(b)) / (n * n)
    if expected == 1:
        return 1.0 if observed == 1 else 0.0
    return (observed - expected) / (1 - expected)


def fleiss_kappa(items: Sequence[Sequence[Hashable]]) -> float | None:
    """Fleiss' kappa over items rated at least twice; None when there are none."""
    rated = [list(r) for r in items if len(r) >= 2]
    if not rated:
        return None
    per_item = []
    totals: Counter[Hashable] = Counter()
    for ratings in rated:
        counts = Counter(ratings)
        totals.update(counts)
        n = len(ratings)
        per_item.append((sum(c * c for c in counts.values()) - n) / (n * (n - 1)))
    observed = sum(per_item) / len(per_item)
    all_ratings = sum(totals.values())
    expected = sum((c / all_ratings) ** 2 for c in totals.values())
    if expected == 1:
        return 1.0 if observed == 1 else 0.0
    return (observed - expected) / (1 - expected)


@dataclass(frozen=True)
class PairAgreement:
    grader_a: str
    grader_b: str
    items: int
    percent: float | None
    kappa: float | None


@dataclass(frozen=True)
class Agreement:
    items: int  # leaves graded by at least two graders
    ratings: int
    percent: float | None
    fleiss: float | None
    pairs: list[PairAgreement]


def agreement(grades: Mapping[str, Mapping[str, Hashable]]) -> Agreement:
    """Statistics from ``{item: {grader: grade}}`` (an item is a leaf of one snapshot)."""
    multi = {item: g for item, g in grades.items() if len(g) >= 2}
    items = [list(g.values()) for g in multi.values()]
    graders = sorted({grader for g in multi.values() for grader in g})
    pairs = []
    for a, b in combinations(graders, 2):
        shared = [g for g in multi.values() if a in g and b in g]
        if not shared:
            continue
        first, second = [g[a] for g in shared], [g[b] for g in shared]
        pairs.append(
            PairAgreement(
                grader_a=a,
                grader_b=b,
                items=len(shared),
                percent=percent_agreement([[x, y] for x, y in zip(first, second, strict=True)]),
                kappa=cohen_kappa(first, second),
            )
        )
    return Agreement(
        items=len(items),
        ratings=sum(len(r) for r in items),
        percent=percent_agreement(items),
        fleiss=fleiss_kappa(items),
        pairs=pairs,
    )
