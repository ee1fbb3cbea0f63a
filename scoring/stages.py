"""EXP-Bench style stage view: rubric grades reported by experiment stage.

EXP-Bench reports agents per stage of an experiment (design, implementation, execution,
conclusion) because they do well on single stages and fail end to end. PaperBench rubrics carry no
stage, so leaves are mapped to stages by their categories through ordered rules: the first rule
whose category and fine-grained category match wins. The mapping is data (``StageMapping``), so a
study can swap it; the default reads:

- Result Analysis -> conclusion
- Code Execution -> execution
- Code Development with Experimental Setup -> design
- Code Development (anything else) -> implementation

A stage score is the tree reduced to the leaves of that stage and aggregated as usual (weights
unchanged), exactly like a category sub-score. Leaves no rule matches are counted as unmapped.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from scoring.rubric import FineGrainedCategory, NodePath, Rubric, RubricNode, TaskCategory
from scoring.rubric_scores import Convention, LeafGrade, TreeScore, aggregate


class Stage(enum.StrEnum):
    DESIGN = "design"
    IMPLEMENTATION = "implementation"
    EXECUTION = "execution"
    CONCLUSION = "conclusion"


class StageRule(BaseModel):
    """Matches leaves by category and/or fine-grained category (None matches anything)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: Stage
    category: TaskCategory | None = None
    finegrained: FineGrainedCategory | None = None

    def matches(self, node: RubricNode) -> bool:
        return (self.category is None or node.task_category is self.category) and (
            self.finegrained is None or node.finegrained_task_category is self.finegrained
        )


class StageMapping(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: tuple[StageRule, ...]

    def stage_of(self, node: RubricNode) -> Stage | None:
        for rule in self.rules:
            if rule.matches(node):
                return rule.stage
        return None


DEFAULT_MAPPING = StageMapping(
    rules=(
        StageRule(stage=Stage.CONCLUSION, category=TaskCategory.RESULT_ANALYSIS),
        StageRule(stage=Stage.EXECUTION, category=TaskCategory.CODE_EXECUTION),
        StageRule(
            stage=Stage.DESIGN,
            category=TaskCategory.CODE_DEVELOPMENT,
            finegrained=FineGrainedCategory.EXPERIMENTAL_SETUP,
        ),
        StageRule(stage=Stage.IMPLEMENTATION, category=TaskCategory.CODE_DEVELOPMENT),
    )
)


class StageReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    stages: dict[str, dict[str, Any]]  # stage -> TreeScore.to_obj()
    leaves_by_stage: dict[str, int]
    unmapped_leaves: int


def stage_scores(
    rubric: Rubric,
    grades: Mapping[str, LeafGrade] | Mapping[NodePath, LeafGrade],
    mapping: StageMapping = DEFAULT_MAPPING,
    convention: Convention = Convention.STRICT,
) -> dict[Stage, TreeScore]:
    """One reduced-tree score per stage that has at least one leaf."""
    present = {mapping.stage_of(node) for _, node in rubric.leaves()}
    result: dict[Stage, TreeScore] = {}
    for stage in Stage:
        if stage not in present:
            continue

        def keep(node: RubricNode, stage: Stage = stage) -> bool:
            return mapping.stage_of(node) is stage

        result[stage] = aggregate(rubric, grades, convention, keep=keep)
    return result


def stage_report(
    rubric: Rubric,
    grades: Mapping[str, LeafGrade] | Mapping[NodePath, LeafGrade],
    mapping: StageMapping = DEFAULT_MAPPING,
    convention: Convention = Convention.STRICT,
) -> StageReport:
    counts: dict[str, int] = {}
    unmapped = 0
    for _, node in rubric.leaves():
        stage = mapping.stage_of(node)
        if stage is None:
            unmapped += 1
        else:
            counts[stage.value] = counts.get(stage.value, 0) + 1
    scores = stage_scores(rubric, grades, mapping, convention)
    return StageReport(
        stages={stage.value: score.to_obj() for stage, score in scores.items()},
        leaves_by_stage=counts,
        unmapped_leaves=unmapped,
    )
