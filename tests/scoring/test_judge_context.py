"""What reaches each leaf's prompt, checked on every leaf of a real rubric through a recording
model: PaperBench's preceding criteria (with its cap), reproduce.sh for Code Development leaves
outside Code-Dev mode, continuous grading of ``Subtree`` leaves, and cache keys that follow."""

from __future__ import annotations

import copy
import itertools
import json
from collections import Counter
from typing import Any

import pytest

from scoring.judge import CachedGrade, Judge, JudgeRun, MemoryGradeCache
from scoring.judge.selection import candidate_files
from scoring.rubric import Rubric, TaskCategory
from tests.conftest import shared_path
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import (
    config,
    grade_prompt_requirement,
    is_ranking,
    materials,
    scripted_answer,
    synthetic_files,
    synthetic_submission,
)
from tests.scoring.rubric_factory import leaf, node, sample

SCRIPT = synthetic_files()["reproduce.sh"].decode()


# --- PaperBench's rules, re-stated from its documentation on the JSON tree ----------------------


def _path_to(root: dict[str, Any], target: str) -> list[dict[str, Any]] | None:
    """Nodes from the root down to the node with id `target` (ids must be unique)."""
    if root["id"] == target:
        return [root]
    for child in root["sub_tasks"]:
        below = _path_to(child, target)
        if below is not None:
            return [root, *below]
    return None


def _prior_nodes(root: dict[str, Any], target: str, cap: int | None) -> list[dict[str, Any]]:
    """Ancestors, preceding siblings of the node and of every ancestor, in tree order."""
    path = _path_to(root, target)
    assert path is not None
    if len(path) == 1:
        return []
    found = [root]
    for parent, child in itertools.pairwise(path):
        ids = [s["id"] for s in parent["sub_tasks"]]
        found.extend(parent["sub_tasks"][: ids.index(child["id"]) + 1])
    found.pop()
    return found[-cap:] if cap is not None else found


def _code_only(tree: dict[str, Any]) -> dict[str, Any] | None:
    """PaperBench's code_only(): drop other leaves, then internal nodes left without children."""
    if not tree["sub_tasks"]:
        return tree if tree["task_category"] == "Code Development" else None
    kept = [c for c in (_code_only(child) for child in tree["sub_tasks"]) if c is not None]
    return {**tree, "sub_tasks": kept} if kept else None


def _json_leaves(tree: dict[str, Any]) -> list[dict[str, Any]]:
    if not tree["sub_tasks"]:
        return [tree]
    return [x for child in tree["sub_tasks"] for x in _json_leaves(child)]


def _listing(nodes: list[dict[str, Any]]) -> str:
    return "".join(f" -> {n['requirements']}\n" for n in nodes)


# --- reading the recorded prompts --------------------------------------------------------------


def _preceding_block(prompt: str) -> str:
    return prompt.split("<preceding_criteria>\n", 1)[1].split("</preceding_criteria>", 1)[0]


def _category(prompt: str) -> str:
    guidance = prompt.split("# Requirement to grade\n\nThis is a ", 1)[1]
    return guidance.split(" requirement", 1)[0]


def _grade(rubric: Rubric, code_dev: bool, cap: int | None) -> tuple[JudgeRun, list[str], set[str]]:
    """The run, every grading prompt (user part) and the distinct system prompts."""
    with FakeOpenAI(answer=scripted_answer) as server:
        run = Judge(config(server.base_url, max_prior_nodes=cap)).grade(
            rubric, materials(), synthetic_submission(), code_dev=code_dev
        )
        grading = [r for r in server.ok_requests() if not is_ranking(r.body)]
    prompts = [str(r.body["messages"][-1]["content"]) for r in grading]
    systems = {str(r.body["messages"][0]["content"]) for r in grading}
    return run, prompts, systems


@pytest.fixture(scope="module")
def rice_obj() -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(
        shared_path("paperbench", "papers", "rice", "rubric.json").read_text()
    )
    return obj


@pytest.mark.parametrize("cap", [None, 5])
@pytest.mark.parametrize("code_dev", [False, True])
def test_every_leaf_prompt_lists_its_preceding_criteria_and_reproduce_sh(
    rice_obj: dict[str, Any], code_dev: bool, cap: int | None
) -> None:
    rubric = Rubric.from_obj(rice_obj)
    assert rubric.stats().duplicate_ids == 0  # the id-based oracle below needs unique ids
    run, prompts, systems = _grade(rubric, code_dev, cap)
    assert len(systems) == 1  # PaperBench's rule on a missing reproduce.sh, outside Code-Dev
    assert ("If reproduce.sh or its log is missing" in systems.pop()) is not code_dev
    assert run.complete

    tree = _code_only(rice_obj) if code_dev else rice_obj
    assert tree is not None
    leaves = _json_leaves(tree)
    # every leaf was graded by the model, exactly once
    assert len(prompts) == len(leaves) == len(run.results)
    expected = Counter(
        (leaf_obj["requirements"], _listing(_prior_nodes(tree, leaf_obj["id"], cap)))
        for leaf_obj in leaves
    )
    seen = Counter((grade_prompt_requirement_text(p), _preceding_block(p)) for p in prompts)
    assert seen == expected
    if cap is not None:
        assert max(_preceding_block(p).count(" -> ") for p in prompts) == cap
    else:  # uncapped: the deepest leaves list more than PaperBench's pinn cap
        assert max(_preceding_block(p).count(" -> ") for p in prompts) > 5

    categories = Counter(_category(p) for p in prompts)
    assert categories["Code Development"] > 100
    for prompt in prompts:
        shows_script = f"\n# reproduce.sh\n\n```\n{SCRIPT}\n```" in prompt
        shows_log = "# reproduce.log" in prompt
        if code_dev:  # no reproduction section: reproduce.sh only as a candidate file
            assert not shows_script and not shows_log
            assert "reproduce.sh" not in prompt.replace(f"## reproduce.sh\n\n```\n{SCRIPT}", "")
        else:
            assert shows_script, _category(prompt)
            assert shows_log == (_category(prompt) != "Code Development")


def grade_prompt_requirement_text(prompt: str) -> str:
    return grade_prompt_requirement({"messages": [{"role": "user", "content": prompt}]})


def test_subtree_leaves_are_graded_with_a_continuous_score() -> None:
    obj = node(
        "root",
        node("a", leaf("a0"), leaf("a1", "Subtree")),
        leaf("b", "Result Analysis", fine="Logging, Analysis & Presentation"),
    )
    rubric = Rubric.from_obj(obj)

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        if is_ranking(body):
            return scripted_answer(body)
        schema = body["response_format"]["json_schema"]["schema"]
        continuous = schema["properties"]["score"]["type"] == "number"
        return {
            "expectations": "e",
            "reality": "r",
            "score": 0.25 if continuous else 1,
            "explanation": "continuous" if continuous else "binary",
        }

    with FakeOpenAI(answer=answer) as server:
        run = Judge(config(server.base_url)).grade(rubric, materials(), synthetic_submission())
        prompts = {
            grade_prompt_requirement(r.body): str(r.body["messages"][-1]["content"])
            for r in server.ok_requests()
            if not is_ranking(r.body)
        }
    assert run.complete
    assert run.results["0.1"].score == 0.25 and run.results["0.1"].explanation == "continuous"
    assert run.results["0.0"].score == 1.0 and run.results["1"].score == 1.0
    subtree = prompts["requirement a1"]
    assert "weighted score of all the criteria in the subtree" in subtree
    assert "# reproduce.log" in subtree
    candidates = candidate_files(synthetic_submission(), TaskCategory.SUBTREE)
    assert "src/pinn/models.py" in candidates and "results/convection.csv" in candidates


def test_cache_keys_change_with_the_preceding_criteria_and_nothing_else() -> None:
    obj = node("root", node("a", leaf("a0"), leaf("a1")), node("b", leaf("b0"), leaf("b1")))
    changed = copy.deepcopy(obj)
    changed["sub_tasks"][1]["requirements"] = "a different parent b"

    def keys(tree: dict[str, Any], cap: int | None = None) -> dict[str, str | None]:
        with FakeOpenAI(answer=scripted_answer) as server:
            run = Judge(config(server.base_url, max_prior_nodes=cap)).grade(
                Rubric.from_obj(tree), materials(), synthetic_submission()
            )
        return {p: r.cache_key for p, r in run.results.items()}

    before, after = keys(obj), keys(changed)
    # a0 and a1 precede b, not the reverse: only b's leaves list the changed parent
    assert before["0.0"] == after["0.0"] and before["0.1"] == after["0.1"]
    assert before["1.0"] != after["1.0"] and before["1.1"] != after["1.1"]
    # a cap of 2 keeps a0's list ([root, a]) and changes b1's ([..., b, b0] -> [b, b0])
    capped = keys(obj, cap=2)
    assert capped["0.0"] == before["0.0"] and capped["1.1"] != before["1.1"]


def test_a_changed_reproduce_sh_regrades_code_development_leaves_too() -> None:
    rubric = Rubric.from_obj(sample())
    changed = synthetic_files()
    changed["reproduce.sh"] += b"python -m pinn.evaluate\n"
    with FakeOpenAI(answer=scripted_answer) as server:
        judge = Judge(config(server.base_url))
        first = judge.grade(rubric, materials(), synthetic_submission())
        cache = MemoryGradeCache()
        for result in first.results.values():
            assert result.cache_key is not None and result.score is not None
            cache.add_grade(
                result.cache_key,
                CachedGrade(result.score, result.expectations, result.reality, result.explanation),
            )
            if result.ranking_key and result.ranked_paths is not None:
                cache.add_ranking(result.ranking_key, result.ranked_paths)
        same = judge.grade(rubric, materials(), synthetic_submission(), cache=cache)
        again = judge.grade(rubric, materials(), synthetic_submission(changed), cache=cache)
        code_dev = judge.grade(
            rubric, materials(), synthetic_submission(changed), cache=cache, code_dev=True
        )
    assert same.calls == [] and all(r.cached for r in same.results.values())
    # every leaf sees reproduce.sh now, Code Development ones included: all are graded again
    assert {p for p, r in again.results.items() if not r.cached} == set(first.results)
    categories = {r.category for r in again.results.values()}
    assert TaskCategory.CODE_DEVELOPMENT in categories
    # Code-Dev mode shows no reproduce.sh, so its keys are its own (not those of either run)
    assert {r.cache_key for r in code_dev.results.values()}.isdisjoint(
        {r.cache_key for r in first.results.values()}
    )
