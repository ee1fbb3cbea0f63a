"""Small rubric trees for tests, built as plain JSON objects."""

from __future__ import annotations

from typing import Any


def leaf(
    node_id: str,
    category: str | None = "Code Development",
    weight: Any = 1,
    fine: str | None = "Method Implementation",
) -> dict[str, Any]:
    return {
        "id": node_id,
        "requirements": f"requirement {node_id}",
        "weight": weight,
        "sub_tasks": [],
        "task_category": category,
        "finegrained_task_category": fine,
    }


def node(node_id: str, *children: dict[str, Any], weight: Any = 1) -> dict[str, Any]:
    return {
        "id": node_id,
        "requirements": f"requirement {node_id}",
        "weight": weight,
        "sub_tasks": list(children),
        "task_category": None,
        "finegrained_task_category": None,
    }


def sample() -> dict[str, Any]:
    """root -> [a (w2) -> [a0 dev, a1 exec], b (w1) -> [b0 analysis, b1 dev (dataset)]]."""
    return node(
        "root",
        node(
            "a",
            leaf("a0", "Code Development"),
            leaf("a1", "Code Execution", fine="Experimental Setup"),
            weight=2,
        ),
        node(
            "b",
            leaf("b0", "Result Analysis", fine="Logging, Analysis & Presentation"),
            leaf("b1", "Code Development", weight=3, fine="Dataset and Model Acquisition"),
        ),
    )
