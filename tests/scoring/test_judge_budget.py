"""A leaf's file budget may be counted late (scoring.judge.engine._Setup.plan): only when ranking
is needed whatever the leaf's text costs and the leaf surely has room. Each leaf's outcome must be
the one the exact count gives: invalid when no room is left, ranked when its files do not fit,
and the same budget when its files are chosen."""

from __future__ import annotations

from scoring.judge import Judge
from scoring.judge.engine import _leaves_to_grade, _Setup
from scoring.rubric import Rubric, TaskCategory
from tests.scoring.judge_support import config, materials, synthetic_submission
from tests.scoring.rubric_factory import leaf, node


def _rubric() -> Rubric:
    leaves = []
    for i, words in enumerate([1, 30, 300, 1_200, 2_000, 3_000]):
        item = leaf(f"l{i}", category="Code Development" if i % 2 else "Code Execution")
        item["requirements"] = f"criterion {i}: " + " ".join(f"w{j}é" for j in range(words))
        leaves.append(item)
    return Rubric.from_obj(node("root", node("a", *leaves[:3]), node("b", *leaves[3:])))


def test_late_budgets_decide_as_the_exact_count() -> None:
    rubric = _rubric()
    for budget in (None, 1_000):
        # Ranking only when the files do not fit (`rank_always` off): the budget decides it.
        judge = Judge(config("http://127.0.0.1:9/v1", context_tokens=12_000,
                             max_output_tokens=1_000, file_token_budget=budget,
                             rank_always=False))  # fmt: skip
        setup = _Setup(judge, materials(), synthetic_submission(), code_dev=False)
        outcomes = set()
        for path, leaf_node, preceding in _leaves_to_grade(rubric, False, None):
            category = leaf_node.task_category or TaskCategory.CODE_DEVELOPMENT
            plan, immediate = setup.plan(path, leaf_node, category, preceding)
            room = setup._room(leaf_node, category, preceding)
            files = sum(setup.tokens(p) for p in plan.candidates)
            if room <= 0:
                assert immediate is not None and not immediate.valid
                outcomes.add("invalid")
                continue
            assert immediate is None
            assert (plan.ranking_key is not None) == (files > room)
            outcomes.add("late" if plan.budget is None else "counted")
            setup.select(plan)
            assert plan.budget == room
        assert {"late", "counted"} <= outcomes
        if budget is None:
            assert "invalid" in outcomes


def test_with_rank_always_every_leaf_with_candidates_is_ranked() -> None:
    """PaperBench ranks every leaf's files, whether they fit or not (the default)."""
    judge = Judge(config("http://127.0.0.1:9/v1", context_tokens=128_000, file_token_budget=None))
    setup = _Setup(judge, materials(), synthetic_submission(), code_dev=False)
    planned = 0
    for path, leaf_node, preceding in _leaves_to_grade(_rubric(), False, None):
        category = leaf_node.task_category or TaskCategory.CODE_DEVELOPMENT
        plan, immediate = setup.plan(path, leaf_node, category, preceding)
        assert immediate is None and plan.candidates and plan.ranking_key is not None
        planned += 1
    assert planned == 6
