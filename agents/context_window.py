"""Fitting a conversation into the model's context window, PaperBench's way.

When the model refuses a conversation as too long, the system message and the first user message
(the instructions and the task) are kept, the oldest 30% of the rest is dropped, and tool replies
whose assistant call was dropped are dropped too (an API refuses a tool message without its call).
A kept assistant message whose tool replies were all cut is kept with its calls: its replies come
right after it, so they are either all kept or it was dropped with them.
"""

from __future__ import annotations

import math
from typing import Any

Message = dict[str, Any]
DROP_FRACTION = 0.3


def truncate(messages: list[Message], fraction: float = DROP_FRACTION) -> list[Message]:
    """The conversation with its oldest exchanges dropped; unchanged when nothing can go."""
    head: list[Message] = []
    rest = list(messages)
    for role in ("system", "user"):
        if rest and rest[0].get("role") == role:
            head.append(rest.pop(0))
    if not rest:
        return list(messages)
    drop = max(1, math.ceil(len(rest) * fraction))
    kept = rest[drop:]
    calls = {c["id"] for m in kept for c in m.get("tool_calls") or []}
    kept = [m for m in kept if m.get("role") != "tool" or m.get("tool_call_id") in calls]
    return head + kept
