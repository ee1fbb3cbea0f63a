"""Graded trees in PaperBench's graded format, read and written.

A graded tree is a rubric whose nodes also carry ``score`` (0..1), ``valid_score`` (false when the
grader failed), ``explanation`` and ``judge_metadata``. Leaves hold the grades; internal nodes hold
the aggregate, which is recomputed here rather than trusted (the stored values are kept so that a
mismatch can be reported). The expert-graded trees of PaperBench's judge evaluation
(``judge_eval/<paper>/expected_result.json``) load as they are; they lack
``finegrained_task_category``, which :meth:`GradedTree.with_rubric` takes from the paper's rubric.

Writing follows PaperBench's judge: internal nodes get the aggregate with missing leaves at 0,
``valid_score`` true (PaperBench marks the aggregation valid whatever lies below) and "Aggregated
score from sub-tasks."; whatever a file stores there is read and kept, never trusted. A leaf that
was never graded is written with ``score: null`` and ``valid_score: false`` so that reading it back
keeps it ungraded, never a silent 0 (PaperBench cannot re-aggregate such a tree: its writers grade
every leaf, and so does ``baseline judge run``). On reading, a leaf with a null score is ungraded;
one with a score and ``valid_score`` false is invalid (PaperBench writes failed leaves as score 0,
valid_score false).

PaperBench's judge also writes a *grader output* (its ``JudgeOutput``): the graded tree under
``graded_task_tree`` with ``judge_type``, ``score``, ``num_leaf_nodes``,
``num_invalid_leaf_nodes``, ``graded_at``, ``completer_config`` and ``token_usage`` beside it. Both
the bare tree and the wrapper are read (the wrapper's fields are kept as :class:`GraderOutput`), and
:meth:`GradedTree.to_grader_output` writes the wrapper.
"""

from __future__ import annotations

import json
import math
import time
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
    parse_path,
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


TokenUsage = dict[str, dict[str, int]]  # PaperBench's: model -> {"in": tokens, "out": tokens}


@dataclass(frozen=True)
class GraderOutput:
    """The fields of PaperBench's grader-output wrapper around the graded tree, as read."""

    judge_type: str
    score: float | None
    num_leaf_nodes: int | None
    num_invalid_leaf_nodes: int | None
    graded_at: str | None
    token_usage: TokenUsage | None
    completer_config: object = None


def is_grader_output(obj: object) -> bool:
    return isinstance(obj, dict) and "graded_task_tree" in obj


def _read_wrapper(obj: dict[str, Any], source: str | None) -> GraderOutput:
    """The wrapper's fields; RubricError naming the first that PaperBench could not read."""
    issues: list[RubricIssue] = []
    for key in ("judge_type", "score", "num_leaf_nodes", "num_invalid_leaf_nodes", "graded_at"):
        if key not in obj:
            issues.append(RubricIssue("<root>", f"grader output lacks {key!r}"))
    judge_type = obj.get("judge_type")
    if "judge_type" in obj and not isinstance(judge_type, str):
        issues.append(RubricIssue("judge_type", f"must be a string, got {describe(judge_type)}"))
    numbers: dict[str, float | None] = {}
    for key in ("score", "num_leaf_nodes", "num_invalid_leaf_nodes"):
        value = obj.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            issues.append(RubricIssue(key, f"must be a number, got {describe(value)}"))
            value = None
        numbers[key] = value
    usage = obj.get("token_usage")
    if usage is not None and not (
        isinstance(usage, dict)
        and all(
            isinstance(u, dict) and all(isinstance(u.get(k), int) for k in ("in", "out"))
            for u in usage.values()
        )
    ):
        issues.append(RubricIssue("token_usage", "must map model names to {'in': n, 'out': n}"))
        usage = None
    if issues:
        raise RubricError(issues, source)
    leaves, invalid = numbers["num_leaf_nodes"], numbers["num_invalid_leaf_nodes"]
    graded_at = obj.get("graded_at")
    return GraderOutput(
        judge_type=str(judge_type),
        score=numbers["score"],
        num_leaf_nodes=None if leaves is None else int(leaves),
        num_invalid_leaf_nodes=None if invalid is None else int(invalid),
        graded_at=graded_at if isinstance(graded_at, str) else None,
        token_usage=usage,
        completer_config=obj.get("completer_config"),
    )


def paperbench_timestamp() -> str:
    """PaperBench's ``graded_at`` format: ``YYYY-MM-DDTHH-MM-SS-Z``, UTC."""
    return time.strftime("%Y-%m-%dT%H-%M-%S-%Z", time.gmtime())


@dataclass(frozen=True)
class GradedTree:
    rubric: Rubric
    grades: dict[NodePath, LeafGrade]
    stored: dict[NodePath, StoredNode] = field(default_factory=dict)
    grader_output: GraderOutput | None = None  # when read from PaperBench's wrapper

    # --- reading -------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, *, strict: bool = False) -> GradedTree:
        """A bare graded tree or PaperBench's grader output holding one."""
        path = Path(path)
        return cls.loads(read_document(path), source=str(path), strict=strict)

    @classmethod
    def loads(
        cls, data: str | bytes, source: str | None = None, *, strict: bool = False
    ) -> GradedTree:
        return cls.from_obj(parse_json(data, source), source=source, strict=strict)

    @classmethod
    def from_obj(
        cls, obj: object, source: str | None = None, *, strict: bool = False
    ) -> GradedTree:
        if is_grader_output(obj):
            assert isinstance(obj, dict)
            wrapper = _read_wrapper(obj, source)
            tree = cls.from_obj(obj["graded_task_tree"], source=source, strict=strict)
            return GradedTree(
                rubric=tree.rubric, grades=tree.grades, stored=tree.stored, grader_output=wrapper
            )
        rubric = Rubric.from_obj(obj, source=source, strict=strict)
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
                    valid_score=True,  # PaperBench's: the aggregation itself is valid
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

    def to_grader_output(
        self,
        *,
        judge_type: str,
        token_usage: TokenUsage | None = None,
        graded_at: str | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """PaperBench's grader-output wrapper (what its ``JudgeOutput.from_dict`` reads).

        ``completer_config`` is null: PaperBench would build its own completer class from it, and
        Baseline's judge settings are not that class's; they go under `extra` keys instead, which
        PaperBench ignores.
        """
        tree = aggregate(self.rubric, self.grades, Convention.PAPERBENCH)
        leaves = self.rubric.stats().leaves
        return {
            "judge_type": judge_type,
            "score": tree.root.lower,
            "num_leaf_nodes": leaves,
            "num_invalid_leaf_nodes": tree.root.missing,
            "graded_at": graded_at or paperbench_timestamp(),
            "graded_task_tree": self.to_obj(),
            "completer_config": None,
            "token_usage": token_usage,
            **(extra or {}),
        }


def graded_tree(
    rubric: Rubric, grades: Mapping[str, LeafGrade] | Mapping[NodePath, LeafGrade]
) -> GradedTree:
    """A graded tree from a rubric and grades keyed by path (text or tuple), validated."""
    return GradedTree(rubric=rubric, grades=normalise_grades(rubric, grades))


def graded_variant(
    variant: Rubric, grades: Mapping[str, LeafGrade] | Mapping[NodePath, LeafGrade]
) -> GradedTree:
    """A graded tree of a derived rubric (e.g. ``rubric.code_dev()``, PaperBench's
    ``code_only()``) from grades keyed by paths in the rubric it came from; grades of leaves the
    variant dropped are left out."""
    new_path = {old: new for new, old in variant.origin.items()}
    moved: dict[NodePath, LeafGrade] = {}
    for raw, grade in grades.items():
        old = parse_path(raw)
        if not variant.origin:
            moved[old] = grade
        elif old in new_path:
            moved[new_path[old]] = grade
    return graded_tree(variant, moved)
