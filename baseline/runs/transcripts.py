"""Agent transcripts: reading them back as a conversation, exporting them, showing them.

The loop (`baseline.runs.agent_runs`) writes one `TranscriptEntry` per step, and so do a command
agent's runner, the model passthrough and the workspace API, each through `append_entry`. This
module reads them back: the conversation the model sees next (messages still in context),
JSON lines for export, and the rows of the coordinators' transcript page, each placed on the
attempt's timeline (its working time, and the first snapshot that captured the workspace after
it). Graders never get here: the page and the export are staff-only, since a transcript names
the model and unblinds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from baseline.errors import NotFound
from baseline.models import AgentRun, Attempt, Snapshot, TranscriptEntry

Message = dict[str, Any]


def append_entry(session: Session, run_id: int, **values: Any) -> None:
    """Append one entry at its run's next sequence number, in the caller's transaction.

    Several writers append to one run at once: a command agent's runner writes notices while
    the agent's model calls arrive through the passthrough and its tool calls through the
    workspace API, from other threads or processes. Reading the largest number and inserting
    the next one in two statements let two writers take the same number (a UNIQUE failure that
    ended an attempt). The number is taken inside the INSERT, which SQLite runs under its one
    write lock, after locking the run's row, which makes a second PostgreSQL writer wait for the
    first one's commit (SQLite has no row locks: the clause is left out there)."""
    session.execute(
        select(AgentRun.id).where(AgentRun.id == run_id).with_for_update(key_share=True)
    )
    next_seq = (
        select(func.coalesce(func.max(TranscriptEntry.seq), 0) + 1)
        .where(TranscriptEntry.run_id == run_id)
        .scalar_subquery()
    )
    session.execute(insert(TranscriptEntry).values(run_id=run_id, seq=next_seq, **values))


def context_rows(session: Session, run_id: int) -> list[TranscriptEntry]:
    """The message entries still in the model's context, in order."""
    return list(
        session.scalars(
            select(TranscriptEntry)
            .where(
                TranscriptEntry.run_id == run_id,
                TranscriptEntry.kind == "message",
                TranscriptEntry.in_context.is_(True),
            )
            .order_by(TranscriptEntry.seq)
        )
    )


def conversation(session: Session, run_id: int) -> list[Message]:
    """The messages the model sees next: every message entry still in context, in order."""
    return [message_of(row) for row in context_rows(session, run_id)]


def message_of(row: TranscriptEntry) -> Message:
    message: Message = {"role": row.role, "content": row.content}
    if row.tool_calls:
        message["tool_calls"] = row.tool_calls
    if row.role == "tool":
        message["tool_call_id"] = row.tool_call_id
    return message


def entry_json(row: TranscriptEntry) -> dict[str, Any]:
    return {
        "seq": row.seq,
        "kind": row.kind,
        "role": row.role,
        "content": row.content,
        "tool_calls": row.tool_calls,
        "tool_call_id": row.tool_call_id,
        "tool_name": row.tool_name,
        "exit_code": row.exit_code,
        "timed_out": row.timed_out,
        "output_sha256": row.output_sha256,
        "output_bytes": row.output_bytes,
        "in_context": row.in_context,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "cost_usd": row.cost_usd,
        "started_at": row.started_at.isoformat(),
        "ended_at": row.ended_at.isoformat(),
        "working_s": row.working_s,
    }


def run_of(session: Session, attempt_id: int) -> AgentRun | None:
    return session.scalar(select(AgentRun).where(AgentRun.attempt_id == attempt_id))


def export_jsonl(session: Session, attempt_id: int) -> str:
    """The transcript as JSON lines: a header line with the run's settings, then one per entry."""
    run = run_of(session, attempt_id)
    if run is None:
        raise NotFound(f"attempt {attempt_id} has no agent transcript")
    header = {
        "run_id": run.id,
        "attempt_id": attempt_id,
        "scaffold": run.scaffold,
        "model": run.model,
        "settings": run.settings,
        "status": run.status.value,
        "steps": run.steps,
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "cost_usd": run.cost_usd,
        "end_reason": run.end_reason,
    }
    lines = [json.dumps(header, sort_keys=True)]
    lines += [json.dumps(entry_json(e), sort_keys=True) for e in run.entries]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class TranscriptRow:
    entry: TranscriptEntry
    snapshot: Snapshot | None  # the first snapshot taken after this step

    @property
    def working_hour(self) -> int:
        return int(self.entry.working_s // 3600)


def timeline(session: Session, attempt: Attempt) -> tuple[AgentRun | None, list[TranscriptRow]]:
    run = run_of(session, attempt.id)
    if run is None:
        return None, []
    taken = sorted(attempt.snapshots, key=lambda s: s.taken_at)
    rows = []
    for entry in run.entries:
        after = next((s for s in taken if s.taken_at >= entry.ended_at), None)
        rows.append(TranscriptRow(entry, after))
    return run, rows
