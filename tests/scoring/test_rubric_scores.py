"""Aggregation: PaperBench's weighted mean, honest about missing leaves, category sub-scores."""

from __future__ import annotations

import pytest

from scoring.rubric import NodePath, Rubric, RubricError, parse_path
from scoring.rubric_scores import Convention, LeafGrade, aggregate, score_report
from tests.scoring.rubric_factory import leaf, node, sample


def _rubric() -> Rubric:
    return Rubric.from_obj(sample())


ALL = {"0.0": LeafGrade(1.0), "0.1": LeafGrade(0.0), "1.0": LeafGrade(1.0), "1.1": LeafGrade(0.0)}


def test_weighted_mean_up_the_tree() -> None:
    tree = aggregate(_rubric(), ALL)
    # a = (1*1 + 0*1)/2 = 0.5 ; b = (1*1 + 0*3)/4 = 0.25 ; root = (0.5*2 + 0.25*1)/3
    assert tree.nodes[(0,)].lower == 0.5
    assert tree.nodes[(1,)].lower == 0.25
    assert tree.score == pytest.approx((0.5 * 2 + 0.25) / 3, abs=1e-15)
    assert tree.missing == 0 and tree.invalid == () and tree.ungraded == ()


def test_grades_keyed_by_tuples() -> None:
    by_tuple: dict[NodePath, LeafGrade] = {parse_path(k): v for k, v in ALL.items()}
    assert aggregate(_rubric(), by_tuple).score == aggregate(_rubric(), ALL).score


def test_zero_weights_give_zero() -> None:
    rubric = Rubric.from_obj(node("r", leaf("x", weight=0), leaf("y", weight=0)))
    assert aggregate(rubric, {"0": LeafGrade(1.0), "1": LeafGrade(1.0)}).score == 0.0


def test_missing_and_invalid_leaves_are_never_silent_zeros() -> None:
    grades = {"0.0": LeafGrade(1.0), "0.1": LeafGrade(None, valid=False), "1.0": LeafGrade(1.0)}
    strict = aggregate(_rubric(), grades)
    assert strict.score is None
    assert strict.missing == 2
    assert strict.invalid == ((0, 1),) and strict.ungraded == ((1, 1),)
    assert strict.root.lower == pytest.approx((0.5 * 2 + 0.25) / 3)
    assert strict.root.upper == pytest.approx((1.0 * 2 + 1.0) / 3)
    paperbench = aggregate(_rubric(), grades, Convention.PAPERBENCH)
    assert paperbench.score == strict.root.lower
    assert paperbench.missing == 2  # still reported
    # An invalid grade that carries a number is still not trusted.
    flagged = dict(ALL, **{"0.0": LeafGrade(1.0, valid=False)})
    assert aggregate(_rubric(), flagged).score is None


def test_bad_grades_are_refused_with_their_path() -> None:
    with pytest.raises(RubricError, match="0: graded, but not a leaf"):
        aggregate(_rubric(), {"0": LeafGrade(1.0)})
    with pytest.raises(RubricError, match=r"0\.7: no node at this path"):
        aggregate(_rubric(), {"0.7": LeafGrade(1.0)})
    with pytest.raises(RubricError, match=r"1.0: score must be in \[0, 1\], got 2"):
        aggregate(_rubric(), {"1.0": LeafGrade(2.0)})
    with pytest.raises(RubricError, match="not a node path"):
        aggregate(_rubric(), {"a.b": LeafGrade(1.0)})


def test_category_scores_use_the_reduced_tree() -> None:
    report = score_report(_rubric(), ALL)
    dev = report.by_category["Code Development"]
    # reduced tree: a -> [a0=1] (w2), b -> [b1=0 (w3)] (w1): (1*2 + 0*1)/3
    assert dev.score == pytest.approx(2 / 3)
    assert report.by_category["Code Execution"].score == 0.0
    assert report.by_category["Result Analysis"].score == 1.0
    assert report.by_finegrained["Dataset and Model Acquisition"].score == 0.0
    assert set(report.to_obj()["categories"]) == {
        "Code Development",
        "Code Execution",
        "Result Analysis",
    }
    # Code-Dev variant scored on its own equals the category sub-score.
    code = _rubric().code_dev()
    assert aggregate(code, {"0.0": LeafGrade(1.0), "1.0": LeafGrade(0.0)}).score == dev.score


def test_resources_provided_changes_the_score() -> None:
    provided = _rubric().resources_provided()
    # b -> [b0=1 (w1), b1 (w0)] = 1.0 ; root = (0.5*2 + 1*1)/3
    assert aggregate(provided, ALL).score == pytest.approx(2 / 3)


def test_selection_with_no_leaf_is_an_error() -> None:
    rubric = Rubric.from_obj(node("r", leaf("x", "Code Execution")))
    with pytest.raises(RubricError, match="no leaf matches"):
        aggregate(rubric, {}, keep=lambda n: n.task_category is None)
