"""Judge evaluation: a judge's leaf grades against expert grades of the same rubric.

PaperBench measures a judge by macro-F1 over leaves against human grades (o3-mini-high 0.83, o1
0.84, gpt-4o 0.73, random 0.50). Here, as PaperBench computes them: accuracy, and precision,
recall and F1 averaged over the classes (0, 1) that occur in the expert's or the judge's grades
(scikit-learn's ``average="macro"`` with its default labels and ``zero_division=0``: a category
whose leaves are all 1 and all judged 1 has F1 1.0), overall and per task category, the confusion
matrix (rows: expert 0/1, columns: judge 0/1), and the judge's cost or tokens when its tree
records them.

Leaves the expert did not grade (or graded invalid) carry no truth and are left out, and counted.
A leaf the judge left ungraded or invalid is left out too, as PaperBench does, and counted and
printed, so that failing is seen; ``invalid_as_zero`` counts it as a judge 0 instead (stricter: a
judge cannot look better by failing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from scoring.rubric import RubricError, RubricIssue, format_path, json_path
from scoring.rubric_graded import GradedTree

# PaperBench's published macro-F1 of its SimpleJudge on JudgeEval, by model (from its paper).
PUBLISHED_F1 = {"o3-mini-high": 0.83, "o1": 0.84, "gpt-4o": 0.73, "random": 0.50}


def published_line() -> str:
    figures = ", ".join(f"{model} {f1:.2f}" for model, f1 in PUBLISHED_F1.items())
    return f"PaperBench's published F1 on JudgeEval (SimpleJudge): {figures}"


@dataclass(frozen=True)
class BinaryMetrics:
    n: int
    accuracy: float
    precision: float  # macro over classes 0 and 1
    recall: float
    f1: float
    confusion: list[list[int]]  # [[tn, fp], [fn, tp]]: rows expert, columns judge


def binary_metrics(y_true: Sequence[int], y_pred: Sequence[int]) -> BinaryMetrics:
    if len(y_true) != len(y_pred):
        raise ValueError("y_true and y_pred differ in length")
    matrix = [[0, 0], [0, 0]]
    for truth, pred in zip(y_true, y_pred, strict=True):
        matrix[truth][pred] += 1
    n = len(y_true)
    precisions: list[float] = []
    recalls: list[float] = []
    f1s: list[float] = []
    labels = sorted(set(y_true) | set(y_pred)) or [0, 1]
    for label in labels:
        tp = matrix[label][label]
        fp = matrix[1 - label][label]
        fn = matrix[label][1 - label]
        precisions.append(tp / (tp + fp) if tp + fp else 0.0)
        recalls.append(tp / (tp + fn) if tp + fn else 0.0)
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return BinaryMetrics(
        n=n,
        accuracy=(matrix[0][0] + matrix[1][1]) / n if n else 0.0,
        precision=sum(precisions) / len(labels),
        recall=sum(recalls) / len(labels),
        f1=sum(f1s) / len(labels),
        confusion=matrix,
    )


@dataclass
class JudgeEvaluation:
    overall: BinaryMetrics
    by_category: dict[str, BinaryMetrics]
    leaves: int
    gold_ungraded: int  # left out: no expert truth
    judge_unusable: int  # left out, or counted as judge 0 with `invalid_as_zero`
    invalid_as_zero: bool
    cost_usd: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    pairs: list[tuple[str, str, int, int]] = field(default_factory=list)  # path, category, y, ŷ

    def to_obj(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("pairs")
        return data


def check_same_rubric(gold: GradedTree, pred: GradedTree) -> None:
    """RubricError naming the first node where the two trees' rubrics differ."""
    mine = list(gold.rubric.walk())
    theirs = list(pred.rubric.walk())
    for (path, a), (_, b) in zip(mine, theirs, strict=False):
        for attribute in ("id", "requirements", "weight", "task_category"):
            if getattr(a, attribute) != getattr(b, attribute):
                raise RubricError(
                    [
                        RubricIssue(
                            json_path(path, attribute),
                            "the gold and predicted trees are not of the same rubric "
                            f"({attribute} differs at node {format_path(path) or '<root>'})",
                        )
                    ]
                )
        if len(a.sub_tasks) != len(b.sub_tasks):
            raise RubricError(
                [
                    RubricIssue(
                        json_path(path, "sub_tasks"),
                        "the gold and predicted trees are not of the same rubric "
                        f"({len(a.sub_tasks)} vs {len(b.sub_tasks)} sub_tasks)",
                    )
                ]
            )
    if len(mine) != len(theirs):
        raise RubricError(
            [RubricIssue("<root>", f"node counts differ: {len(mine)} vs {len(theirs)}")]
        )


def _wrapper_tokens(pred: GradedTree) -> tuple[int, int] | None:
    """Prompt and completion tokens from PaperBench's wrapper (it records no cost)."""
    usage = pred.grader_output.token_usage if pred.grader_output is not None else None
    if not usage:
        return None
    return (
        sum(int(u.get("in", 0)) for u in usage.values()),
        sum(int(u.get("out", 0)) for u in usage.values()),
    )


def evaluate(
    gold: GradedTree, pred: GradedTree, *, invalid_as_zero: bool = False
) -> JudgeEvaluation:
    check_same_rubric(gold, pred)
    pairs: list[tuple[str, str, int, int]] = []
    gold_ungraded = judge_unusable = 0
    cost = 0.0
    prompt = completion = 0
    costed = False
    for path, node in gold.rubric.leaves():
        truth = gold.grades.get(path)
        guess = pred.grades.get(path)
        meta = guess.judge_metadata if guess is not None else None
        if isinstance(meta, dict) and isinstance(meta.get("cost_usd"), int | float):
            costed = True
            cost += float(meta["cost_usd"])
            prompt += int(meta.get("prompt_tokens") or 0)
            completion += int(meta.get("completion_tokens") or 0)
        if truth is None or not truth.usable:
            gold_ungraded += 1
            continue
        if guess is None or not guess.usable:
            judge_unusable += 1
            if not invalid_as_zero:
                continue
            y_pred = 0
        else:
            y_pred = int((guess.score or 0.0) >= 0.5)
        category = node.task_category.value if node.task_category else "none"
        pairs.append((format_path(path), category, int((truth.score or 0.0) >= 0.5), y_pred))
    if not pairs:
        raise RubricError(
            [RubricIssue("<root>", "no leaf has both an expert grade and a usable judge grade")]
        )
    tokens = None if costed else _wrapper_tokens(pred)
    if tokens is not None:
        prompt, completion = tokens
    by_category = {
        category: binary_metrics(
            [y for _, c, y, _ in pairs if c == category],
            [p for _, c, _, p in pairs if c == category],
        )
        for category in sorted({c for _, c, _, _ in pairs})
    }
    return JudgeEvaluation(
        overall=binary_metrics([y for *_, y, _ in pairs], [p for *_, p in pairs]),
        by_category=by_category,
        leaves=len(pairs),
        gold_ungraded=gold_ungraded,
        judge_unusable=judge_unusable,
        invalid_as_zero=invalid_as_zero,
        cost_usd=cost if costed else None,
        prompt_tokens=prompt if costed or tokens else None,
        completion_tokens=completion if costed or tokens else None,
        pairs=pairs,
    )


def format_table(result: JudgeEvaluation) -> str:
    """A plain-text report for the terminal."""
    rows = [("overall", result.overall), *result.by_category.items()]
    lines = [f"{'':18} {'n':>6} {'acc':>6} {'prec':>6} {'rec':>6} {'F1':>6}  confusion"]
    for name, m in rows:
        (tn, fp), (fn, tp) = m.confusion
        lines.append(
            f"{name:18} {m.n:6d} {m.accuracy:6.3f} {m.precision:6.3f} {m.recall:6.3f} "
            f"{m.f1:6.3f}  tn={tn} fp={fp} fn={fn} tp={tp}"
        )
    treated = "counted as 0" if result.invalid_as_zero else "left out, as PaperBench does"
    lines.append(
        f"leaves compared: {result.leaves}; without expert grade (left out): "
        f"{result.gold_ungraded}; judge invalid or ungraded ({treated}): "
        f"{result.judge_unusable}"
    )
    if result.cost_usd is not None:
        lines.append(
            f"judge cost: ${result.cost_usd:.4f} ({result.prompt_tokens} prompt + "
            f"{result.completion_tokens} completion tokens)"
        )
    elif result.prompt_tokens is not None:
        lines.append(
            f"judge cost: not recorded; {result.prompt_tokens} prompt + "
            f"{result.completion_tokens} completion tokens (the wrapper's token_usage)"
        )
    else:
        lines.append("judge cost: not recorded in the predicted tree")
    return "\n".join(lines)
