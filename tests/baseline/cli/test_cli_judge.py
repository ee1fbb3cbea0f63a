"""`baseline judge run`: grade a directory against a rubric through an OpenAI-compatible API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from baseline.cli import cli
from scoring.rubric_graded import GradedTree
from tests.conftest import shared_path
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import materials, scripted_answer, synthetic_files


def _submission(root: Path) -> None:
    for path, data in synthetic_files().items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def test_judge_run_writes_a_graded_tree(tmp_path: Path) -> None:
    rubric = shared_path("paperbench", "papers", "all-in-one", "rubric.json")
    _submission(tmp_path / "sub")
    paper = tmp_path / "paper.md"
    paper.write_text(materials().paper)
    out = tmp_path / "graded.json"
    with FakeOpenAI(answer=scripted_answer) as server:
        result = CliRunner().invoke(
            cli,
            [
                "judge", "run", "--rubric", str(rubric), "--submission", str(tmp_path / "sub"),
                "--paper", str(paper), "--log", str(tmp_path / "sub" / "reproduce.log"),
                "--changed", "results/wave.csv", "--base-url", server.base_url,
                "--model", "local-model", "--price-in", "0", "--price-out", "0",
                "--out", str(out),
            ],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert server.calls > 0
    tree = GradedTree.load(out)
    assert len(tree.grades) == 174 and all(g.usable for g in tree.grades.values())
    assert "graded 174 leaves (0 invalid)" in result.output
    data = json.loads(out.read_text())
    assert data["sub_tasks"][0]["explanation"] == "Aggregated score from sub-tasks."


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "my-llama"], "no price known for model 'my-llama'"),
        (["--model", "o3-mini", "--price-in", "1"], "give both --price-in and --price-out"),
        (["--model", "o3-mini", "--tpm", "0"], "bad judge setting tokens_per_minute"),
        (["--model", "o3-mini", "--rpm", "-5"], "bad judge setting requests_per_minute"),
    ],
)
def test_judge_run_bad_settings_are_one_line(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    rubric = shared_path("paperbench", "papers", "all-in-one", "rubric.json")
    paper = tmp_path / "paper.md"
    paper.write_text("paper")
    result = CliRunner().invoke(
        cli,
        [
            "judge", "run", "--rubric", str(rubric), "--submission", str(tmp_path),
            "--paper", str(paper), "--base-url", "http://127.0.0.1:9/v1",
            "--out", str(tmp_path / "o.json"), *extra,
        ],
    )  # fmt: skip
    assert result.exit_code == 1 and message in result.output


def test_judge_run_and_judge_eval_send_the_same_prompts_for_the_same_folder(
    tmp_path: Path,
) -> None:
    """`judge run` reads the submission's own reproduce.log and the addenda beside the paper, as
    `judge-eval --submission` (and PaperBench) do: the same folder gives the same prompts."""
    gold = shared_path("paperbench", "judge_eval", "all-in-one", "expected_result.json")
    papers = tmp_path / "paper"
    papers.mkdir()
    (papers / "paper.md").write_text(materials().paper)
    (papers / "addendum.md").write_text("Use the second dataset split.")
    (papers / "judge.addendum.md").write_text("Accept either optimiser spelling.")
    (papers / "rubric.json").write_text(GradedTree.load(gold).rubric.dumps())
    _submission(tmp_path / "sub")
    prompts: dict[str, list[str]] = {}
    with FakeOpenAI(answer=scripted_answer) as server:
        judge = ["--base-url", server.base_url, "--model", "m", "--price-in", "0",
                 "--price-out", "0"]  # fmt: skip
        for name, args in {
            "run": ["judge", "run", "--rubric", str(papers / "rubric.json"), "--submission",
                    str(tmp_path / "sub"), "--out", str(tmp_path / "run.json")],
            "eval": ["judge-eval", "--gold", str(gold), "--paper", str(papers), "--submission",
                     str(tmp_path / "sub")],
        }.items():  # fmt: skip
            server.reset()
            result = CliRunner().invoke(cli, [*args, *judge])
            assert result.exit_code == 0, result.output
            prompts[name] = sorted(
                json.dumps(r.body["messages"], sort_keys=True) for r in server.requests
            )
    assert len(prompts["run"]) > 100
    assert prompts["run"] == prompts["eval"]
    joined = "\n".join(prompts["run"])
    assert "Accept either optimiser spelling." in joined and "second dataset split" in joined
    assert "epoch 2 loss 0.4\\n  (repeated 2 times)" in joined  # its own reproduce.log, reduced
    assert "(the submission was not reproduced)" not in joined


def test_judge_run_says_which_reproduction_and_addenda_it_used(tmp_path: Path) -> None:
    rubric = shared_path("paperbench", "papers", "all-in-one", "rubric.json")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "main.py").write_text("print(1)\n")
    paper = tmp_path / "paper.md"
    paper.write_text("paper")
    with FakeOpenAI(answer=scripted_answer) as server:
        result = CliRunner().invoke(
            cli,
            [
                "judge", "run", "--rubric", str(rubric), "--submission", str(tmp_path / "sub"),
                "--paper", str(paper), "--base-url", server.base_url, "--model", "m",
                "--price-in", "0", "--price-out", "0", "--out", str(tmp_path / "o.json"),
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"no reproduce.log in {tmp_path / 'sub'}: graded as not reproduced" in result.output
    assert f"addendum: none ({tmp_path / 'addendum.md'} does not exist)" in result.output


def test_code_dev_on_a_rubric_without_code_development_grades_the_root_as_one(
    tmp_path: Path,
) -> None:
    """PaperBench grades such a rubric in Code-Dev mode as its root alone, one Code Development
    leaf (was: "no leaf is left in this variant")."""
    rubric = {
        "id": "root", "requirements": "the paper is reproduced", "weight": 1,
        "task_category": None, "finegrained_task_category": None,
        "sub_tasks": [
            {"id": "e", "requirements": "it runs", "weight": 1, "sub_tasks": [],
             "task_category": "Code Execution", "finegrained_task_category": None},
        ],
    }  # fmt: skip
    (tmp_path / "rubric.json").write_text(json.dumps(rubric))
    (tmp_path / "paper.md").write_text("paper")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "main.py").write_text("x = 1\n")
    out = tmp_path / "o.json"
    with FakeOpenAI(answer=scripted_answer) as server:
        result = CliRunner().invoke(
            cli,
            [
                "judge", "run", "--rubric", str(tmp_path / "rubric.json"), "--submission",
                str(tmp_path / "sub"), "--code-dev", "--base-url", server.base_url, "--model", "m",
                "--price-in", "0", "--price-out", "0", "--out", str(out),
            ],
        )  # fmt: skip
        grading = [r for r in server.ok_requests() if "# Requirement to grade" in str(r.body)]
    assert result.exit_code == 0, result.output
    assert len(grading) == 1 and "the paper is reproduced" in str(grading[0].body)
    tree = json.loads(out.read_text())
    assert tree["id"] == "root" and tree["sub_tasks"] == []
    assert tree["task_category"] == "Code Development" and tree["valid_score"] is True
