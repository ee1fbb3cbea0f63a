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
