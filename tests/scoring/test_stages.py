"""Stage view: default and custom mappings from categories to EXP-Bench stages."""

from __future__ import annotations

import pytest

from scoring.rubric import FineGrainedCategory, Rubric, TaskCategory
from scoring.rubric_scores import LeafGrade
from scoring.stages import (
    DEFAULT_MAPPING,
    Stage,
    StageMapping,
    StageRule,
    stage_report,
    stage_scores,
)
from tests.conftest import shared_path
from tests.scoring.rubric_factory import leaf, node

TREE = node(
    "r",
    leaf("dev", "Code Development", fine="Method Implementation"),
    leaf("design", "Code Development", fine="Experimental Setup"),
    leaf("run", "Code Execution", fine="Experimental Setup"),
    leaf("result", "Result Analysis", fine="Logging, Analysis & Presentation"),
)
GRADES = {"0": LeafGrade(1.0), "1": LeafGrade(0.0), "2": LeafGrade(1.0), "3": LeafGrade(0.0)}


def test_default_mapping() -> None:
    scores = stage_scores(Rubric.from_obj(TREE), GRADES)
    assert {stage: s.score for stage, s in scores.items()} == {
        Stage.DESIGN: 0.0,
        Stage.IMPLEMENTATION: 1.0,
        Stage.EXECUTION: 1.0,
        Stage.CONCLUSION: 0.0,
    }


def test_custom_mapping_and_unmapped_leaves() -> None:
    mapping = StageMapping(
        rules=(
            StageRule(stage=Stage.DESIGN, finegrained=FineGrainedCategory.EXPERIMENTAL_SETUP),
            StageRule(stage=Stage.CONCLUSION, category=TaskCategory.RESULT_ANALYSIS),
        )
    )
    report = stage_report(Rubric.from_obj(TREE), GRADES, mapping)
    assert report.leaves_by_stage == {"design": 2, "conclusion": 1}
    assert report.unmapped_leaves == 1
    assert report.stages["design"]["score"] == pytest.approx(0.5)
    # A mapping is data: it reads from JSON.
    assert StageMapping.model_validate_json(mapping.model_dump_json()) == mapping


def test_missing_grades_stay_missing_per_stage() -> None:
    scores = stage_scores(Rubric.from_obj(TREE), {"0": LeafGrade(1.0)})
    assert scores[Stage.IMPLEMENTATION].score == 1.0
    assert scores[Stage.EXECUTION].score is None and scores[Stage.EXECUTION].missing == 1


def test_every_real_leaf_has_a_default_stage() -> None:
    rubric = Rubric.load(shared_path("paperbench", "papers", "rice", "rubric.json"))
    report = stage_report(rubric, {}, DEFAULT_MAPPING)
    assert report.unmapped_leaves == 0
    assert sum(report.leaves_by_stage.values()) == rubric.stats().leaves
