"""A study's agent attempts as Inspect AI evaluation logs, written with `inspect_ai`'s own
library, so evaluators read them in ``inspect view`` as they read their own runs.

One log per task and agent group (Inspect has one model per log), one sample per attempt: the
whole conversation (messages still in the agent's context and those truncated away), each tool
call with its arguments, the model usage of the run, and a score per checkpoint taken from the
tidy table, so a score here is the analysis' score (a failure at the floor is 0 and says why;
a checkpoint without a usable score is left out of ``scores`` and named in the sample's
metadata with the reason).

`inspect_ai` is an optional dependency (the ``inspect`` extra): without it the export says how to
install it.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from sqlalchemy import select
from sqlalchemy.orm import Session

from analysis.table import SOURCE_SNAPSHOT, build_table
from baseline.errors import InvalidInput
from baseline.models import AgentRun, Attempt, ParticipantKind, Study, TranscriptEntry

if TYPE_CHECKING:
    from inspect_ai.log import EvalLog, EvalSample
    from inspect_ai.model import ChatMessage

MISSING_PACKAGE = (
    "the Inspect AI export needs the inspect_ai package: pip install 'baseline[inspect]' "
    "(or pip install inspect_ai)"
)


def require_inspect() -> None:
    """Refuse, saying how to install it, when `inspect_ai` is missing (before any work)."""
    try:
        import inspect_ai  # noqa: F401
    except ImportError as exc:
        raise InvalidInput(MISSING_PACKAGE) from exc


def write_inspect_logs(session: Session, study: Study, out_dir: Path) -> list[Path]:
    """Write one ``.eval`` log per task and agent group into `out_dir`; returns their paths."""
    require_inspect()
    from inspect_ai.log import write_eval_log

    table = build_table(session, study)
    attempts = list(
        session.scalars(select(Attempt).where(Attempt.study_id == study.id).order_by(Attempt.id))
    )
    by_log: dict[tuple[str, str], list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        if attempt.participant.kind is ParticipantKind.AGENT:
            by_log[(attempt.task.slug, attempt.participant.group)].append(attempt)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for (task, group), chosen in sorted(by_log.items()):
        log = eval_log(session, study, task, group, chosen, table)
        path = out_dir / f"{_safe(task)}_{_safe(group)}.eval"
        write_eval_log(log, path, format="eval")
        written.append(path)
    return written


def eval_log(
    session: Session,
    study: Study,
    task: str,
    group: str,
    attempts: list[Attempt],
    table: pd.DataFrame,
) -> EvalLog:
    """The log of one task and agent group: one sample per attempt."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalSpec, EvalStats
    from inspect_ai.model import ModelUsage

    first = attempts[0].participant
    samples = [_sample(session, attempt, table) for attempt in attempts]
    usage: dict[str, ModelUsage] = {}
    for sample in samples:
        for model, used in sample.model_usage.items():
            usage[model] = usage[model] + used if model in usage else used
    created = min((a.created_at for a in attempts), default=None)
    return EvalLog(
        status="success",
        eval=EvalSpec(
            created=_iso(created) or "",
            task=task,
            task_display_name=attempts[0].task.title,
            dataset=EvalDataset(
                name=task, samples=len(samples), sample_ids=[s.id for s in samples]
            ),
            model=first.agent_model or group,
            solver=first.agent_scaffold,
            config=EvalConfig(),
            metadata={"study": study.name, "group": group, "source": "baseline"},
        ),
        stats=EvalStats(started_at=_iso(created) or "", model_usage=usage),
        samples=samples,
    )


def _sample(session: Session, attempt: Attempt, table: pd.DataFrame) -> EvalSample:
    from inspect_ai.log import EvalSample
    from inspect_ai.model import ModelUsage

    run = session.scalar(select(AgentRun).where(AgentRun.attempt_id == attempt.id))
    entries = [] if run is None else list(run.entries)
    messages = _messages(entries)
    scores, missing = _scores(table[table["attempt_id"] == attempt.id])
    usage = {}
    if run is not None:
        usage[run.model] = ModelUsage(
            input_tokens=run.prompt_tokens,
            output_tokens=run.completion_tokens,
            total_tokens=run.prompt_tokens + run.completion_tokens,
            total_cost=run.cost_usd,
        )
    first_user = next((m.text for m in messages if m.role == "user"), None)
    return EvalSample(
        id=attempt.id,
        epoch=1,
        input=first_user or attempt.task.title,
        target="",
        messages=messages,
        scores=scores,
        model_usage=usage,
        metadata={
            "participant": attempt.participant.pseudonym,
            "attempt_status": attempt.status.value,
            "end_reason": attempt.end_reason,
            "missing_checkpoints": missing,
            "steps": 0 if run is None else run.steps,
            "notices": [e.content for e in entries if e.kind in ("notice", "model_error")],
        },
        started_at=_iso(attempt.started_at),
        completed_at=_iso(attempt.ended_at),
    )


def _messages(entries: list[TranscriptEntry]) -> list[ChatMessage]:
    from inspect_ai.model import (
        ChatMessageAssistant,
        ChatMessageSystem,
        ChatMessageTool,
        ChatMessageUser,
    )
    from inspect_ai.tool import ToolCall

    out: list[ChatMessage] = []
    names: dict[str, str] = {}
    for entry in entries:
        if entry.kind != "message":
            continue
        text = entry.content or ""
        if entry.role == "system":
            out.append(ChatMessageSystem(content=text))
        elif entry.role == "user":
            out.append(ChatMessageUser(content=text))
        elif entry.role == "assistant":
            calls = []
            for call in entry.tool_calls or []:
                function = call.get("function", {})
                names[call["id"]] = str(function.get("name", ""))
                calls.append(
                    ToolCall(
                        id=call["id"],
                        function=names[call["id"]],
                        arguments=_arguments(function.get("arguments")),
                    )
                )
            out.append(ChatMessageAssistant(content=text, tool_calls=calls or None))
        elif entry.role == "tool":
            call_id = entry.tool_call_id or ""
            out.append(
                ChatMessageTool(
                    content=text,
                    tool_call_id=call_id,
                    function=entry.tool_name or names.get(call_id),
                )
            )
    return out


def _arguments(raw: Any) -> dict[str, Any]:
    """A tool call's arguments as the model wrote them (JSON text); kept as text if not JSON."""
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"raw": raw}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def _scores(rows: pd.DataFrame) -> tuple[dict[str, Any], dict[str, str]]:
    from inspect_ai.scorer import Score

    scores: dict[str, Any] = {}
    missing: dict[str, str] = {}
    points = rows[rows["checkpoint_hours"].notna()]
    for row in points.sort_values("checkpoint_hours").itertuples():
        name = f"checkpoint_{row.checkpoint_hours:g}h"
        if row.source != SOURCE_SNAPSHOT or isinstance(row.missing, str):
            missing[name] = str(row.missing or "not measured")
            continue
        if not math.isfinite(row.score):
            missing[name] = "no score"
            continue
        scores[name] = Score(
            value=float(row.score),
            explanation=None if row.floor is None else f"at the task's floor: {row.floor}",
            metadata={"working_hours": row.working_hours, "grading_kind": row.grading_kind},
        )
    return scores, missing


def _iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"
