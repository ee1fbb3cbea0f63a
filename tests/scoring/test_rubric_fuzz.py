"""No input makes the rubric or graded-tree loader raise anything but RubricError."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scoring.rubric import Rubric, RubricError
from scoring.rubric_graded import GradedTree
from scoring.rubric_scores import aggregate
from tests.scoring.rubric_factory import sample

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(
        ["Code Development", "Code Execution", "Result Analysis", "Method Implementation"]
    )
)
_json = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "id",
                    "requirements",
                    "weight",
                    "sub_tasks",
                    "task_category",
                    "finegrained_task_category",
                    "score",
                    "valid_score",
                    "explanation",
                    "x",
                ]
            ),
            children,
            max_size=7,
        )
    ),
    max_leaves=30,
)


def _load_all_ways(obj: Any) -> None:
    for loader in (Rubric.from_obj, GradedTree.from_obj):
        try:
            result = loader(obj)
        except RubricError as exc:
            assert exc.issues and str(exc)
        else:
            rubric = result if isinstance(result, Rubric) else result.rubric
            score = aggregate(rubric, {}).root
            assert 0.0 <= score.lower <= score.upper <= 1.0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json)
def test_random_json_values(obj: Any) -> None:
    _load_all_ways(obj)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    for loader in (Rubric.loads, GradedTree.loads):
        with contextlib.suppress(RubricError):
            loader(data)


_paths = st.lists(st.integers(min_value=0, max_value=1), min_size=0, max_size=2)


@settings(max_examples=300, deadline=None)
@given(_paths, st.sampled_from(sorted(sample())), _scalars | _json)
def test_mutations_of_a_valid_tree(path: list[int], key: str, value: Any) -> None:
    tree = sample()
    target = tree
    for index in path:
        children = target.get("sub_tasks")
        if not isinstance(children, list) or index >= len(children):
            break
        target = children[index]
    target[key] = value
    _load_all_ways(tree)
    text = json.dumps(tree, allow_nan=True)
    with contextlib.suppress(RubricError):
        Rubric.loads(text)


def test_weights_valid_for_python_but_not_for_us() -> None:
    tree = sample()
    tree["weight"] = 1e308
    try:
        Rubric.from_obj(tree)
    except RubricError as exc:
        assert exc.path == "weight"
    else:
        raise AssertionError("a weight of 1e308 was accepted")
    assert math.isfinite(float(10**300))
