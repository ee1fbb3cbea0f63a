"""Graded trees in PaperBench's graded format, read and written.

A graded tree is a rubric whose nodes also carry ``score`` (0..1), ``valid_score`` (false when the
grader failed), ``explanation`` and ``judge_metadata``. Leaves hold the grades; internal nodes hold
the aggregate, which is recomputed here rather than trusted (the stored values are kept so that a
mismatch can be reported). The expert-graded trees of PaperBench's judge evaluation
(``judge_eval/<paper>/expected_result.json``) load as they are; they lack
``finegrained_task_category``, which :meth:`GradedTree.with_rubric` takes from the paper's rubric.

Writing follows PaperBench: internal nodes get the aggregate with missing leaves at 0 and
``valid_score`` true only when every leaf below is usable. A leaf that was never graded is written
with ``score: null`` and ``valid_score: false`` so that reading it back keeps it ungraded, never a
silent 0. On reading, a leaf with a null score is ungraded; one with a score and ``valid_score``
false is invalid (PaperBench writes failed leaves as score 0, valid_score false).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scoring.rubric import (
    NodePath,
    Rubric,
    RubricError,
    RubricIssue,
    RubricNode,
    describe,
    json_path,
    parse_json,
    read_document,
)
from scoring.rubric_scores import (
    Convention,
    LeafGrade,
    ScoreReport,
    TreeScore,
    aggregate,
    normalise_grades,
    score_report,
)

AGGREGATED_EXPLANATION = "Aggregated score from sub-tasks."


@dataclass(frozen=True)
class StoredNode:
    """What a graded file said about an internal node (kept to check it against the leaves)."""

    score: float | None
    valid: bool | None
    explanation: str


@dataclass(frozen=True)
class GradedTree:
    rubric: Rubric
    grades: dict[NodePath, LeafGrade]
    stored: dict[NodePath, StoredNode] = field(default_factory=dict)

    # --- reading -------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path) -> GradedTree:
        path = Path(path)
        return cls.loads(read_document(path), source=str(path))

    @classmethod
    def loads(cls, data: str | bytes, source: str | None = None) -> GradedTree:
        return cls.from_obj(parse_json(data, source), source=source)

    @classmethod
    def from_obj(cls, obj: object, source: str | None = None) -> GradedTree:
        rubric = Rubric.from_obj(obj, source=source)
        grades: dict[NodePath, LeafGrade] = {}
        stored: dict[NodePath, StoredNode] = {}
        issues: list[RubricIssue] = []
        stack: list[tuple[NodePath, dict[str, Any], RubricNode]] = [((), obj, rubric.root)]  # type: ignore[list-item]
        while stack and len(issues) < 20:
            path, raw, node = stack.pop()
            score = raw.get("score")
            if score is not None and (
                isinstance(score, bool)
                or not isinstance(score, int | float)
                or not math.isfinite(score)
                or not 0 <= score <= 1
            ):
                issues.append(
                    RubricIssue(
                        json_path(path, "score"),
                        f"must be a number in [0, 1] or null, got {describe(score)}",
                    )
                )
                score = None
            valid = raw.get("valid_score")
            if not isinstance(valid, bool) and valid in (0, 1):  # pinn's expert tree stores 1.0
                valid = bool(valid)
            if valid is not None and not isinstance(valid, bool):
                issues.append(
                    RubricIssue(
                        json_path(path, "valid_score"),
                        f"must be true or false (or 1/0), got {describe(valid)}",
                    )
                )
                valid = None
            explanation = raw.get("explanation", "")
            if explanation is None:
                explanation = ""
            if not isinstance(explanation, str):
                issues.append(
                    RubricIssue(
                        json_path(path, "explanation"),
                        f"must be a string, got {describe(explanation)}",
                    )
                )
                explanation = ""
            if node.sub_tasks:
                stored[path] = StoredNode(score=score, valid=valid, explanation=explanation)
                children = raw["sub_tasks"]
                for index in range(len(node.sub_tasks) - 1, -1, -1):
                    stack.append(((*path, index), children[index], node.sub_tasks[index]))
            elif score is not None:  # a leaf without a score is ungraded, whatever else it says
                grades[path] = LeafGrade(
                    score=float(score),
                    valid=valid is not False,
                    explanation=explanation,
                    judge_metadata=raw.get("judge_metadata"),
                )
        if issues:
            raise RubricError(issues, source)
        return cls(rubric=rubric, grades=grades, stored=stored)

    # --- scoring -------------------------------------------------------------------------------

    def score(self, convention: Convention = Convention.STRICT) -> TreeScore:
        return aggregate(self.rubric, self.grades, convention)

    def report(self, convention: Convention = Convention.STRICT) -> ScoreReport:
        return score_report(self.rubric, self.grades, convention)

    @property
    def stored_root_score(self) -> float | None:
        """The score the file stored at its root (None for a one-leaf tree or when absent)."""
        if () in self.stored:
            return self.stored[()].score
        grade = self.grades.get(())
        return None if grade is None else grade.score

    def with_rubric(self, rubric: Rubric) -> GradedTree:
        """The same grades on `rubric`, which must have the same shape and ids (categories differ).

        Used to get fine-grained categories for graded files that do not store them.
        """
        mine = list(self.rubric.walk())
        theirs = list(rubric.walk())
        for (path, node), (other_path, other) in zip(mine, theirs, strict=False):
            if (
                path != other_path
                or node.id != other.id
                or len(node.sub_tasks) != len(other.sub_tasks)
            ):
                raise RubricError(
                    [
                        RubricIssue(
                            json_path(path),
                            "the rubric does not match the graded tree here: "
                            f"id {node.id!r} with {len(node.sub_tasks)} sub_tasks vs "
                            f"id {other.id!r} with {len(other.sub_tasks)}",
                        )
                    ]
                )
        if len(mine) != len(theirs):
            raise RubricError(
                [RubricIssue("<root>", f"node counts differ: {len(mine)} vs {len(theirs)}")]
            )
        return GradedTree(rubric=rubric, grades=self.grades, stored=self.stored)

    # --- writing -------------------------------------------------------------------------------

    def to_obj(self) -> dict[str, Any]:
        """PaperBench's graded format (internal scores recomputed with missing leaves at 0)."""
        tree = aggregate(self.rubric, self.grades, Convention.PAPERBENCH)

        def build(node: RubricNode, path: NodePath) -> dict[str, Any]:
            base: dict[str, Any] = {
                "id": node.id,
                "requirements": node.requirements,
                "weight": node.weight,
            }
            if node.sub_tasks:
                aggregate_score = tree.nodes[path]
                base.update(
                    score=aggregate_score.lower,
                    valid_score=aggregate_score.missing == 0,
                    task_category=None,
                    finegrained_task_category=None,
                    explanation=AGGREGATED_EXPLANATION,
                    judge_metadata=None,
                )
                base["sub_tasks"] = [
                    build(child, (*path, i)) for i, child in enumerate(node.sub_tasks)
                ]
                return base
            grade = self.grades.get(path)
            base.update(
                score=None if grade is None else grade.score,
                valid_score=grade is not None and grade.usable,
                task_category=node.task_category.value if node.task_category else None,
                finegrained_task_category=(
                    node.finegrained_task_category.value if node.finegrained_task_category else None
                ),
                explanation="not graded" if grade is None else grade.explanation,
                judge_metadata=None if grade is None else grade.judge_metadata,
                sub_tasks=[],
            )
            return base

        return build(self.rubric.root, ())

    def dumps(self, indent: int | None = 4) -> str:
        return json.dumps(self.to_obj(), indent=indent, ensure_ascii=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.dumps(), encoding="utf-8")


def graded_tree(
    rubric: Rubric, grades: Mapping[str, LeafGrade] | Mapping[NodePath, LeafGrade]
) -> GradedTree:
    """A graded tree from a rubric and grades keyed by path (text or tuple), validated."""
    return GradedTree(rubric=rubric, grades=normalise_grades(rubric, grades))
