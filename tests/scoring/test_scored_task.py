"""Scored-task specs: normalisation, direction, log transform, folder loading, score output."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from scoring.scored_task import (
    ScoredTaskError,
    ScoringSpec,
    load_scored_task,
    parse_score_output,
    parse_spec,
)


def _spec(**overrides: Any) -> ScoringSpec:
    data: dict[str, Any] = {"script": "score.py", "starting_score": 0.5, "reference_score": 0.9}
    data.update(overrides)
    return parse_spec({"id": "t", "title": "T", "scoring": data}).scoring


def test_normalise_higher_is_better() -> None:
    spec = _spec()
    assert spec.normalise(0.5) == 0.0
    assert spec.normalise(0.9) == pytest.approx(1.0)
    assert spec.normalise(0.7) == pytest.approx(0.5)
    assert spec.normalise(1.3) == pytest.approx(2.0)  # above the reference is kept
    assert spec.normalise(0.1) == pytest.approx(-1.0)


def test_normalise_lower_is_better_with_log() -> None:
    spec = _spec(starting_score=100.0, reference_score=1.0, direction="lower", log_transform=True)
    assert spec.normalise(100.0) == 0.0
    assert spec.normalise(1.0) == pytest.approx(1.0)
    assert spec.normalise(10.0) == pytest.approx(0.5)
    assert spec.normalise(0.1) == pytest.approx(1.5)
    with pytest.raises(ScoredTaskError, match="cannot be log-transformed"):
        spec.normalise(0.0)


def test_the_starting_score_of_a_lower_is_better_task_is_zero_not_minus_zero() -> None:
    spec = _spec(starting_score=0.4, reference_score=0.1, direction="lower")
    assert f"{spec.normalise(0.4):.3f}" == "0.000"


def test_normalise_log_of_loss_minus_floor() -> None:
    """RE-Bench's log(loss - floor): a loss of 1.5 + 9 starts, 1.5 + 1 is the reference."""
    spec = _spec(
        starting_score=10.5,
        reference_score=2.5,
        direction="lower",
        log_transform=True,
        log_floor=1.5,
    )
    assert spec.normalise(10.5) == 0.0 and spec.normalise(2.5) == 1.0
    assert spec.normalise(4.5) == pytest.approx(0.5)  # log(3) is halfway from log(9) to log(1)
    with pytest.raises(ScoredTaskError, match=r"cannot be log-transformed \(must be > 1.5\)"):
        spec.normalise(1.5)
    with pytest.raises(ScoredTaskError, match="log_floor needs log_transform"):
        _spec(log_floor=0.1)
    with pytest.raises(ScoredTaskError, match=r"reference_score > 1\.5"):
        _spec(
            starting_score=10.5,
            reference_score=1.0,
            direction="lower",
            log_transform=True,
            log_floor=1.5,
        )


@pytest.mark.parametrize("raw", [math.nan, math.inf, True, "0.5"])
def test_unusable_raw_scores(raw: Any) -> None:
    with pytest.raises(ScoredTaskError, match="raw score must be a finite number"):
        _spec().normalise(raw)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"reference_score": 0.5}, "scoring: reference_score equals starting_score (0.5)"),
        (
            {"reference_score": 0.1},
            "direction is 'higher' but reference_score 0.1 < starting_score",
        ),
        ({"direction": "lower"}, "direction is 'lower' but reference_score 0.9 > starting_score"),
        ({"starting_score": -1.0, "log_transform": True}, "log_transform needs"),
        ({"direction": "sideways"}, "scoring.direction: Input should be 'higher' or 'lower'"),
        ({"starting_score": "nan"}, "scoring.starting_score"),
        ({"script": "../x.py"}, "script must be a relative path inside the task folder"),
        ({"surprise": 1}, "scoring.surprise: Extra inputs are not permitted"),
    ],
)
def test_bad_specs_name_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ScoredTaskError) as info:
        _spec(**overrides)
    assert message in str(info.value)


def test_bad_slug() -> None:
    with pytest.raises(ScoredTaskError, match="id: must be a slug"):
        parse_spec({"id": "Bad Slug", "title": "x", "scoring": {}})


def _folder(tmp_path: Path, yaml_text: str) -> Path:
    (tmp_path / "task.yaml").write_text(yaml_text)
    return tmp_path


GOOD = """
id: demo
title: Demo
instructions: instructions.md
starting_files: starting
scoring:
  script: score.py
  protected: [protected]
  starting_score: 1
  reference_score: 2
"""


def test_load_folder_checks_paths(tmp_path: Path) -> None:
    folder = _folder(tmp_path, GOOD)
    with pytest.raises(ScoredTaskError, match=r"instructions: instructions\.md does not exist"):
        load_scored_task(folder)
    (folder / "instructions.md").write_text("do it")
    (folder / "score.py").write_text("print(1)")
    (folder / "starting").mkdir()
    with pytest.raises(ScoredTaskError, match=r"scoring.protected\[0\]: protected does not exist"):
        load_scored_task(folder)
    (folder / "protected").mkdir()
    spec = load_scored_task(folder)
    assert spec.scoring.protected == ("protected",)
    assert (
        spec.scoring.render_command("/s/score.py", "/sub")
        == "python3 /s/score.py --submission /sub"
    )


def test_load_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(ScoredTaskError, match="cannot read"):
        load_scored_task(tmp_path)
    _folder(tmp_path, "id: [unclosed")
    with pytest.raises(ScoredTaskError, match="not valid YAML"):
        load_scored_task(tmp_path)
    _folder(tmp_path, "- a list")
    with pytest.raises(ScoredTaskError, match="must be a mapping"):
        load_scored_task(tmp_path)


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("training...\n0.93\n", (0.93, "")),
        ('log\n{"score": 0.5, "message": "ok"}\n\n', (0.5, "ok")),
        ('{"score": null, "message": "no predictions file"}', (None, "no predictions file")),
    ],
)
def test_parse_score_output(stdout: str, expected: tuple[float | None, str]) -> None:
    assert parse_score_output(stdout) == expected


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        ("", "printed nothing"),
        ("done\n", "last line is not a score: 'done'"),
        ('{"value": 1}', "has no 'score'"),
        ('{"score": "high"}', "not a finite number"),
        ("NaN", "not a finite number"),
    ],
)
def test_parse_score_output_errors(stdout: str, message: str) -> None:
    with pytest.raises(ScoredTaskError, match=message):
        parse_score_output(stdout)
