"""A ranking answer that leaves requirements out costs those leaves their ranking, not their
grade (PaperBench: a bad ranking only costs a leaf some files): the left-out leaves are asked once
more, together, and a leaf left out again takes its files in candidate order, recorded as such and
never cached as a ranking."""

from __future__ import annotations

import re
from typing import Any

from scoring.judge import Judge, SubmissionView
from scoring.rubric import Rubric
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import (
    config,
    is_ranking,
    materials,
    scripted_answer,
    synthetic_submission,
)
from tests.scoring.rubric_factory import leaf, node

STUBBORN = "requirement dev3"  # every ranking answer leaves this one out
ONCE = "requirement dev1"  # only the first ranking answer that lists it leaves it out
_NUMBERED = re.compile(r"^(\d+)\. \[[^\]]+\] (.*)$", re.M)


def _rubric() -> Rubric:
    return Rubric.from_obj(node("root", *(leaf(f"dev{i}") for i in range(5))))


def test_left_out_requirements_are_asked_again_then_fall_back_to_candidate_order() -> None:
    left_out_once: set[str] = set()

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        reply = scripted_answer(body)
        if not is_ranking(body):
            return reply
        items = body["messages"][-1]["content"].split("\n\n# Requirements\n\n", 1)[1]
        texts = {int(m.group(1)): m.group(2) for m in _NUMBERED.finditer(items)}
        drop = {n for n, text in texts.items() if text == STUBBORN}
        if ONCE not in left_out_once:
            drop |= {n for n, text in texts.items() if text == ONCE}
            left_out_once.update(text for text in texts.values() if text == ONCE)
        reply["rankings"] = [r for r in reply["rankings"] if r["requirement"] not in drop]
        return reply

    with FakeOpenAI(answer=answer) as server:
        # A small file budget: the candidates do not fit, every leaf needs a ranking.
        run = Judge(config(server.base_url, file_token_budget=1_000)).grade(
            _rubric(), materials(), synthetic_submission()
        )
        rankings = [r for r in server.ok_requests() if is_ranking(r.body)]
    assert run.complete, run.invalid
    assert left_out_once == {ONCE}
    assert len(rankings) == 2  # the batch, then dev1 and dev3 again
    by_id = {r.leaf_id: r for r in run.results.values()}
    stubborn, once = by_id["dev3"], by_id["dev1"]
    assert stubborn.unranked_fallback and stubborn.ranked_paths is None
    assert stubborn.details()["unranked_fallback"] is True
    assert stubborn.files  # files in candidate order, within the budget
    assert not once.unranked_fallback and once.ranked_paths
    assert all(not r.unranked_fallback and r.ranked_paths for k, r in by_id.items() if k != "dev3")


def _rank_every_file_backwards(body: dict[str, Any]) -> dict[str, Any]:
    if not is_ranking(body):
        return scripted_answer(body)
    files_part = body["messages"][-1]["content"].split("\n\n# Requirements\n\n", 1)[0]
    paths = files_part.removeprefix("# Files\n\n").split("\n")
    return {"rankings": [{"requirement": 1, "paths": sorted(paths, reverse=True)}]}


def test_at_most_max_files_are_shown_in_ranked_order_even_when_all_fit() -> None:
    files = {f"src/m{i:02}.py": f"def f{i}():\n    return {i}\n".encode() for i in range(15)}
    submission = SubmissionView(files=files)
    rubric = Rubric.from_obj(node("root", leaf("dev0")))
    shown: dict[str, list[str]] = {}
    for name, overrides in {
        "paperbench": {},
        "everything that fits": {"rank_always": False, "max_files": None},
    }.items():
        with FakeOpenAI(answer=_rank_every_file_backwards) as server:
            run = Judge(config(server.base_url, file_token_budget=None, **overrides)).grade(
                rubric, materials(), submission
            )
            ranked = [r for r in server.ok_requests() if is_ranking(r.body)]
        (result,) = run.results.values()
        shown[name] = result.files
        assert len(ranked) == (1 if name == "paperbench" else 0)
    # PaperBench: the first 10 of the ranking, in its order
    assert shown["paperbench"] == sorted(files, reverse=True)[:10]
    assert shown["everything that fits"] == sorted(files)
