"""Graded trees: PaperBench's expert trees load and score to their stored root; round trips."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scoring.rubric import Rubric, RubricError
from scoring.rubric_graded import GradedTree, graded_tree
from scoring.rubric_scores import LeafGrade
from tests.conftest import shared_path
from tests.scoring.rubric_factory import sample

JUDGE_EVAL = (
    "all-in-one",
    "pinn",
    "rice",
    "semantic-self-consistency",
    "stay-on-topic-with-classifier-free-guidance",
)


@pytest.mark.parametrize("paper", JUDGE_EVAL)
def test_expert_trees_score_to_their_stored_root(paper: str) -> None:
    path = shared_path("paperbench", "judge_eval", paper, "expected_result.json")
    stored = json.loads(path.read_text())["score"]
    tree = GradedTree.load(path)
    score = tree.score()
    assert score.missing == 0
    assert score.score == pytest.approx(stored, abs=1e-9)
    assert tree.stored_root_score == stored
    # Written back and read again: the same grades and the same score.
    again = GradedTree.loads(tree.dumps())
    assert again.grades == tree.grades
    assert again.score().score == score.score


def test_expert_tree_takes_finegrained_categories_from_the_paper_rubric() -> None:
    graded = GradedTree.load(
        shared_path("paperbench", "judge_eval", "rice", "expected_result.json")
    )
    assert graded.report().by_finegrained == {}
    rubric = Rubric.load(shared_path("paperbench", "papers", "rice", "rubric.json"))
    joined = graded.with_rubric(rubric)
    assert "Method Implementation" in joined.report().by_finegrained
    assert joined.score().score == graded.score().score


def test_with_rubric_refuses_another_shape() -> None:
    graded = GradedTree.from_obj(sample())
    other = sample()
    other["sub_tasks"][1]["sub_tasks"].pop()
    with pytest.raises(RubricError, match=r"sub_tasks\[1\]: the rubric does not match"):
        graded.with_rubric(Rubric.from_obj(other))


def test_write_keeps_ungraded_leaves_ungraded() -> None:
    rubric = Rubric.from_obj(sample())
    tree = graded_tree(
        rubric,
        {
            "0.0": LeafGrade(1.0, explanation="ok", judge_metadata={"model": "m"}),
            "0.1": LeafGrade(0.0, valid=False, explanation="unparseable"),
        },
    )
    obj = tree.to_obj()
    assert obj["valid_score"] is True  # as PaperBench writes internal nodes
    assert obj["explanation"] == "Aggregated score from sub-tasks."
    leaf_b0 = obj["sub_tasks"][1]["sub_tasks"][0]
    assert leaf_b0["score"] is None and leaf_b0["valid_score"] is False
    back = GradedTree.from_obj(obj)
    assert back.grades == tree.grades
    strict = back.score()
    assert (
        strict.score is None and strict.ungraded == ((1, 0), (1, 1)) and strict.invalid == ((0, 1),)
    )


def _graded_sample(**leaf_changes: Any) -> dict[str, Any]:
    tree = sample()
    target = tree["sub_tasks"][0]["sub_tasks"][1]
    target.update({"score": 1.0, "valid_score": True, "explanation": "", "judge_metadata": None})
    target.update(leaf_changes)
    return tree


@pytest.mark.parametrize(
    ("changes", "where", "message"),
    [
        (
            {"score": 1.5},
            "sub_tasks[0].sub_tasks[1].score",
            "must be a number in [0, 1] or null, got 1.5",
        ),
        ({"score": "1"}, "sub_tasks[0].sub_tasks[1].score", "got a string"),
        ({"score": float("nan")}, "sub_tasks[0].sub_tasks[1].score", "got nan"),
        ({"valid_score": "yes"}, "sub_tasks[0].sub_tasks[1].valid_score", "must be true or false"),
        ({"explanation": 3}, "sub_tasks[0].sub_tasks[1].explanation", "must be a string, got 3"),
    ],
)
def test_malformed_grades_name_their_json_path(
    changes: dict[str, Any], where: str, message: str
) -> None:
    with pytest.raises(RubricError) as info:
        GradedTree.from_obj(_graded_sample(**changes))
    assert info.value.path == where
    assert message in info.value.message


def test_numeric_valid_score_is_read_as_a_boolean() -> None:
    tree = GradedTree.from_obj(_graded_sample(valid_score=1.0))
    assert tree.grades[(0, 1)] == LeafGrade(1.0, valid=True, explanation="", judge_metadata=None)
    tree = GradedTree.from_obj(_graded_sample(valid_score=0))
    assert tree.grades[(0, 1)].valid is False
