"""Ranking batches filled while leaves are planned (scoring.judge.engine._Batcher) are the batches
one pass over all plans cuts: per candidate list, in planning order, `size` at a time, leaves whose
ranking a cache holds left out; and the pool runs those rankings before queued grading calls."""

from __future__ import annotations

import threading

import pytest

from scoring.judge.cache import MemoryGradeCache
from scoring.judge.engine import _Batcher, _Plan, _Pool
from scoring.rubric import RubricNode, TaskCategory

GROUPS = (["a.py", "b.py"], ["results/x.csv"])


def _plans(count: int) -> list[_Plan]:
    plans = []
    for i in range(count):
        candidates = GROUPS[0] if i % 3 else GROUPS[1]  # interleaved candidate lists
        plans.append(
            _Plan(
                path=f"0.{i}",
                node=RubricNode(id=f"n{i}", requirements=f"requirement {i}", weight=1),
                category=TaskCategory.CODE_DEVELOPMENT,
                candidates=list(candidates),
                budget=1_000,
                ranking_key=f"key{i}",
            )
        )
    return plans


def _one_pass(plans: list[_Plan], size: int, cached: set[str]) -> list[list[str]]:
    groups: dict[tuple[str, ...], list[_Plan]] = {}
    for plan in plans:
        if plan.ranking_key not in cached:
            groups.setdefault(tuple(plan.candidates), []).append(plan)
    return [
        [p.path for p in group[start : start + size]]
        for group in groups.values()
        for start in range(0, len(group), size)
    ]


@pytest.mark.parametrize("cached_every", [0, 2, 7])
def test_batches_filled_while_planning_are_those_of_one_pass(cached_every: int) -> None:
    size = 4
    plans = _plans(23)
    cache = MemoryGradeCache() if cached_every else None
    cached = {f"key{i}" for i in range(len(plans)) if cached_every and i % cached_every == 0}
    for key in cached:
        assert cache is not None
        cache.add_ranking(key, ["a.py"])
    batcher = _Batcher(size, cache)
    batches: list[list[_Plan]] = []
    known: list[_Plan] = []
    for plan in plans:
        found, full = batcher.add(plan)
        known += found
        batches += full
        assert all(len(b) == size for b in full)  # only full batches go out early
    found, rest = batcher.flush()
    known += found
    batches += rest
    batched = [p.path for b in batches for p in b]
    assert len(batched) + len(known) == len(plans)  # every leaf once: ranked or batched
    assert sorted([p.path for p in b] for b in batches) == sorted(_one_pass(plans, size, cached))
    assert {p.ranking_key for p in known} == cached
    assert all(p.ranked == ["a.py"] for p in known)


def test_the_pool_runs_urgent_work_before_queued_work() -> None:
    pool = _Pool(1)
    started = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def block() -> None:
        started.set()
        release.wait(5)

    try:
        pool.submit(("grade", "first"), block)
        started.wait(5)
        for name in ("a", "b"):
            pool.submit(("grade", name), order.append, name)
        pool.submit(("rank", "r"), order.append, "r", urgent=True)
        release.set()
        finished = 0
        while finished < 4:
            finished += len(pool.done())
    finally:
        pool.executor.shutdown(wait=True)
    assert order == ["r", "a", "b"]
