"""Judge evaluation metrics equal scikit-learn's; `baseline judge-eval` on real expert trees."""

from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

from baseline.cli import cli, main
from scoring.judge_eval import binary_metrics, evaluate, format_table
from scoring.rubric import RubricError
from scoring.rubric_graded import GradedTree
from tests.conftest import shared_path
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import grade_prompt_requirement, is_ranking, scripted_answer


def _leaves(node: dict[str, Any]) -> list[dict[str, Any]]:
    if not node["sub_tasks"]:
        return [node]
    return [leaf for child in node["sub_tasks"] for leaf in _leaves(child)]


def _perturbed(gold: dict[str, Any], seed: int, flip: float) -> dict[str, Any]:
    """A 'judge' tree: the expert grades with a fraction flipped, some leaves invalid."""
    pred = copy.deepcopy(gold)
    rng = random.Random(seed)
    for leaf in _leaves(pred):
        if rng.random() < flip:
            leaf["score"] = 1.0 - leaf["score"]
        if rng.random() < 0.02:
            leaf["score"], leaf["valid_score"] = 0.0, False
        leaf["judge_metadata"] = {"cost_usd": 0.01, "prompt_tokens": 100, "completion_tokens": 7}
    return pred


def _sklearn(y: list[int], p: list[int]) -> dict[str, Any]:
    # PaperBench's call: the labels that occur, no zero-division warning.
    precision, recall, f1, _ = precision_recall_fscore_support(
        y, p, average="macro", zero_division=0
    )
    return {
        "accuracy": accuracy_score(y, p),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "confusion": confusion_matrix(y, p, labels=[0, 1]).tolist(),
    }


@pytest.mark.parametrize("paper", ["pinn", "rice", "all-in-one"])
@pytest.mark.parametrize("flip", [0.0, 0.15, 0.5])
def test_metrics_equal_scikit_learn_on_expert_trees(paper: str, flip: float) -> None:
    gold_obj = json.loads(
        shared_path("paperbench", "judge_eval", paper, "expected_result.json").read_text()
    )
    pred_obj = _perturbed(gold_obj, seed=len(paper), flip=flip)
    result = evaluate(GradedTree.from_obj(gold_obj), GradedTree.from_obj(pred_obj))

    y = [truth for _, _, truth, _ in result.pairs]
    p = [guess for *_, guess in result.pairs]
    # the pairs are the trees' leaves, invalid judge leaves left out (PaperBench)
    gold_leaves, pred_leaves = _leaves(gold_obj), _leaves(pred_obj)
    kept = [i for i, leaf in enumerate(pred_leaves) if leaf["valid_score"]]
    assert y == [int(gold_leaves[i]["score"] >= 0.5) for i in kept]
    assert p == [int(pred_leaves[i]["score"] >= 0.5) for i in kept]
    strict = evaluate(
        GradedTree.from_obj(gold_obj), GradedTree.from_obj(pred_obj), invalid_as_zero=True
    )
    assert [g for *_, g in strict.pairs] == [
        int(leaf["score"] >= 0.5) if leaf["valid_score"] else 0 for leaf in pred_leaves
    ]
    expected = _sklearn(y, p)
    m = result.overall
    assert m.accuracy == pytest.approx(expected["accuracy"])
    assert m.precision == pytest.approx(expected["precision"])
    assert m.recall == pytest.approx(expected["recall"])
    assert m.f1 == pytest.approx(expected["f1"])
    assert m.confusion == expected["confusion"]
    for category, metrics in result.by_category.items():
        yc = [t for _, c, t, _ in result.pairs if c == category]
        pc = [g for _, c, _, g in result.pairs if c == category]
        sk = _sklearn(yc, pc)
        assert metrics.f1 == pytest.approx(sk["f1"]) and metrics.confusion == sk["confusion"]
        assert metrics.precision == pytest.approx(sk["precision"])
        assert metrics.recall == pytest.approx(sk["recall"])
    assert result.judge_unusable == sum(1 for leaf in pred_leaves if not leaf["valid_score"])
    assert result.cost_usd == pytest.approx(0.01 * len(pred_leaves))
    if flip == 0.0 and result.judge_unusable == 0:
        assert m.f1 == 1.0


def test_degenerate_inputs_match_scikit_learn() -> None:
    assert binary_metrics([1, 1, 1], [1, 1, 1]).f1 == 1.0  # one class, predicted perfectly
    for y, p in [([1, 1, 1], [1, 1, 1]), ([0, 0], [1, 1]), ([1, 0, 1, 0], [0, 0, 0, 0])]:
        ours = binary_metrics(y, p)
        expected = _sklearn(y, p)
        assert ours.f1 == pytest.approx(expected["f1"])
        assert ours.precision == pytest.approx(expected["precision"])
        assert ours.recall == pytest.approx(expected["recall"])


def test_trees_of_different_rubrics_are_refused() -> None:
    gold = json.loads(
        shared_path("paperbench", "judge_eval", "rice", "expected_result.json").read_text()
    )
    other = copy.deepcopy(gold)
    _leaves(other)[3]["requirements"] = "something else"
    with pytest.raises(RubricError, match="not of the same rubric"):
        evaluate(GradedTree.from_obj(gold), GradedTree.from_obj(other))


def test_cli_prints_metrics_and_json(tmp_path: Path) -> None:
    gold_path = shared_path("paperbench", "judge_eval", "pinn", "expected_result.json")
    pred_path = tmp_path / "pred.json"
    pred_path.write_text(json.dumps(_perturbed(json.loads(gold_path.read_text()), 1, 0.2)))
    runner = CliRunner()
    table = runner.invoke(cli, ["judge-eval", "--gold", str(gold_path), "--pred", str(pred_path)])
    assert table.exit_code == 0, table.output
    assert "overall" in table.output and "Code Development" in table.output
    out = runner.invoke(
        cli, ["judge-eval", "--gold", str(gold_path), "--pred", str(pred_path), "--json"]
    )
    data = json.loads(out.output)
    expected = evaluate(GradedTree.load(gold_path), GradedTree.load(pred_path))
    assert data["overall"]["f1"] == pytest.approx(expected.overall.f1)
    assert set(data["by_category"]) == {"Code Development", "Code Execution", "Result Analysis"}


@pytest.mark.parametrize(
    ("pred", "message"),
    [("rice", "not of the same rubric"), ("bad", "not valid JSON"), ("missing", "cannot read")],
)
def test_cli_errors_are_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pred: str, message: str
) -> None:
    gold = shared_path("paperbench", "judge_eval", "pinn", "expected_result.json")
    paths = {
        "rice": shared_path("paperbench", "judge_eval", "rice", "expected_result.json"),
        "bad": tmp_path / "bad.json",
        "missing": tmp_path / "nope.json",
    }
    paths["bad"].write_text("{not json")
    with pytest.raises(SystemExit) as exited:
        main(["judge-eval", "--gold", str(gold), "--pred", str(paths[pred])])
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


# --- grading a JudgeEval-style case with a judge ------------------------------------------------


def _expert_leaf(node_id: str, category: str, expert: float, verdict: str) -> dict[str, Any]:
    return {
        "id": node_id,
        "requirements": f"{verdict}: requirement {node_id}",
        "weight": 1,
        "sub_tasks": [],
        "task_category": category,
        "score": expert,
        "valid_score": True,
        "explanation": "expert",
    }


def _case(root: Path) -> tuple[Path, Path, Path]:
    """A paper folder, a submission folder (reproduced: one table produced) and an expert tree."""
    paper = root / "paper"
    paper.mkdir()
    (paper / "paper.md").write_text("# A paper\n\nWe train a model and report accuracy 0.9.")
    (paper / "addendum.md").write_text("Use the small dataset.")
    (paper / "judge.addendum.md").write_text("JUDGE-ONLY NOTE")
    sub = root / "submission"
    (sub / "results").mkdir(parents=True)
    (sub / "train.py").write_text("def train():\n    return 0.9\n")
    (sub / "notes.csv").write_text("old,table\n1,2\n")  # a table not produced by the run
    (sub / "reproduce.sh").write_text("#!/bin/bash\npython train.py > results/acc.csv\n")
    (sub / "reproduce.log").write_text("training... done\n")
    (sub / "results" / "acc.csv").write_text("accuracy\n0.9\n")
    started = 1_700_000_000
    (sub / "reproduce.log.creation_time").write_text(str(started))
    for path in ("train.py", "notes.csv", "reproduce.sh"):
        os.utime(sub / path, (started - 100, started - 100))
    for path in ("reproduce.log", "results/acc.csv"):
        os.utime(sub / path, (started + 10, started + 10))
    leaves = [
        _expert_leaf("d1", "Code Development", 1.0, "good"),
        _expert_leaf("d2", "Code Development", 1.0, "bad"),  # the judge misses it
        _expert_leaf("e1", "Code Execution", 1.0, "good"),
        _expert_leaf("e2", "Code Execution", 0.0, "bad"),
        _expert_leaf("r1", "Result Analysis", 0.0, "good"),  # the judge is too lenient
        _expert_leaf("r2", "Result Analysis", 0.0, "bad"),
    ]
    gold = {
        "id": "root",
        "requirements": "the paper is reproduced",
        "weight": 1,
        "sub_tasks": [
            {
                "id": f"g{i}",
                "requirements": f"group {i}",
                "weight": 1,
                "sub_tasks": leaves[2 * i : 2 * i + 2],
                "task_category": None,
                "score": 0.5,
                "valid_score": True,
                "explanation": "Aggregated score from sub-tasks.",
            }
            for i in range(3)
        ],
        "task_category": None,
        "score": 0.5,
        "valid_score": True,
        "explanation": "Aggregated score from sub-tasks.",
    }
    gold_path = root / "expected_result.json"
    gold_path.write_text(json.dumps(gold))
    return paper, sub, gold_path


def _verdict_answer(body: dict[str, Any]) -> dict[str, Any]:
    if is_ranking(body):
        return scripted_answer(body)
    requirement = grade_prompt_requirement(body)
    score = 1 if requirement.startswith("good:") else 0
    return {"expectations": "e", "reality": "r", "score": score, "explanation": "scripted"}


def test_judge_eval_grades_a_case_end_to_end_against_the_local_server(tmp_path: Path) -> None:
    paper, sub, gold = _case(tmp_path)
    out = tmp_path / "pred.json"
    args = [
        "judge-eval", "--gold", str(gold), "--paper", str(paper), "--submission", str(sub),
        "--model", "local-model", "--price-in", "1", "--price-out", "4", "--out", str(out),
    ]  # fmt: skip
    with FakeOpenAI(answer=_verdict_answer) as server:
        table = CliRunner().invoke(cli, [*args, "--base-url", server.base_url])
        prompts = {
            grade_prompt_requirement(r.body): str(r.body["messages"][-1]["content"])
            for r in server.ok_requests()
            if not is_ranking(r.body)
        }
        # every leaf ranked (PaperBench), one call per candidate list
        rankings = sum(1 for r in server.ok_requests() if is_ranking(r.body))
        server.reset()
        as_json = CliRunner().invoke(cli, [*args, "--base-url", server.base_url, "--json"])
        calls = server.calls
    assert table.exit_code == 0, table.output
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)  # stderr says which addenda and log were read

    # what the judge saw: the addenda, the reproduction, only the table the run produced
    result_prompt = prompts["good: requirement r1"]
    assert "JUDGE-ONLY NOTE" in result_prompt and "training... done" in result_prompt
    assert "results/acc.csv" in result_prompt and "notes.csv" not in result_prompt
    assert "python train.py > results/acc.csv" in prompts["bad: requirement d2"]
    assert (
        "<preceding_criteria>\n -> the paper is reproduced\n -> group 0\n"
        in prompts["bad: requirement d2"]
    )

    # F1 per category equals the metrics of the known verdicts
    expected = {
        "Code Development": binary_metrics([1, 1], [1, 0]),
        "Code Execution": binary_metrics([1, 0], [1, 0]),
        "Result Analysis": binary_metrics([0, 0], [1, 0]),
    }
    for category, metrics in expected.items():
        assert data["by_category"][category]["f1"] == pytest.approx(metrics.f1)
        assert data["by_category"][category]["confusion"] == metrics.confusion
    overall = binary_metrics([1, 1, 1, 0, 0, 0], [1, 0, 1, 0, 1, 0])
    assert data["overall"]["f1"] == pytest.approx(overall.f1)
    assert rankings == 2
    assert data["run"]["calls"] == calls == 6 + rankings and data["run"]["invalid_leaves"] == 0
    assert data["run"]["cost_usd"] > 0
    assert data["published_f1"]["o3-mini-high"] == 0.83

    assert f"overall F1 {overall.f1:.3f}" in table.output
    assert "o3-mini-high 0.83" in table.output
    assert "judge run: 8 model calls (1.333 per leaf" in table.output
    assert "Result Analysis" in table.output
    assert len(GradedTree.load(out).grades) == 6


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "give --pred, or --paper, --submission, --base-url and --model"),
        (["--pred", "p.json", "--paper", "x"], "give either --pred, or --paper"),
        (["--base-url", "http://127.0.0.1:9/v1"], "give both --base-url and --model"),
    ],
)
def test_judge_eval_mode_errors_are_one_line(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    _, _, gold = _case(tmp_path)
    result = CliRunner().invoke(cli, ["judge-eval", "--gold", str(gold), *extra])
    assert result.exit_code == 1 and message in result.output


def test_tokens_from_paperbench_wrapper_are_reported_when_no_cost_is() -> None:
    gold_obj = json.loads(
        shared_path("paperbench", "judge_eval", "rice", "expected_result.json").read_text()
    )
    pred = GradedTree.from_obj(copy.deepcopy(gold_obj))
    wrapper = pred.to_grader_output(
        judge_type="simple",
        token_usage={"o3-mini": {"in": 1200, "out": 300}, "gpt-4o": {"in": 5, "out": 1}},
    )
    result = evaluate(GradedTree.from_obj(gold_obj), GradedTree.from_obj(wrapper))
    assert result.cost_usd is None
    assert (result.prompt_tokens, result.completion_tokens) == (1205, 301)
    assert "judge cost: not recorded; 1205 prompt + 301 completion tokens" in format_table(result)
