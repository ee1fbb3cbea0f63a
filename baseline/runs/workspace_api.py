"""What an attempt token may do: work in its attempt's workspace, read its clock, act on it.

The use cases behind ``/api/v1/attempts/<id>/workspace/...`` (API agents) and the workspace's
`task` command. Every command runs through `agents.tools.WorkspaceTools.execute`, the same path a
built-in agent's tool call takes (the backend's exec, as the workspace user, with the per-call
time-out and output cap), so an API agent sees what a built-in agent and a human see. Every call
is audited (``attempt.workspace.<op>``); for an attempt driven by an API agent (an agent
participant whose scaffold is not a built-in loop) each workspace call is also written to the
attempt's transcript as a tool call and its result, as the built-in loop writes its own, so the
transcript page, the JSON-lines export and the blacklist monitor cover API agents too.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from agents import scaffold as scaffolds
from agents.tools import ToolResult, WorkspaceTools
from baseline import audit
from baseline.attempts import attempts, clock, schedule
from baseline.attempts.snapshots import resolve_source
from baseline.context import Context
from baseline.errors import Conflict, Forbidden, InvalidInput, NotFound
from baseline.grading import script_scoring
from baseline.models import (
    AgentRun,
    AgentRunStatus,
    Attempt,
    Host,
    ParticipantKind,
    PauseReason,
    TaskKind,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.runs import blacklist_monitor
from baseline.runs.transcripts import append_entry, run_of
from baseline.studies.agent_enrolment import API_SCAFFOLD
from baseline.workspaces import workspaces

MAX_TIMEOUT_S = 600.0
MAX_OUTPUT_BYTES = 1024 * 1024  # what one API call returns of a command's output
MAX_WRITE_BYTES = 64 * 1024  # one argv entry (base64) stays well under the kernel's 128 KiB
WRITE_SCRIPT = (
    'mkdir -p -- "$(dirname -- "$1")" && '
    'if [ "$3" = append ]; then printf %s "$2" | base64 -d >> "$1"; '
    'else printf %s "$2" | base64 -d > "$1"; fi'
)
LIST_SCRIPT = (
    'test -d "$1" || { echo "no such directory: $1" >&2; exit 2; }; '
    "find \"$1\" -mindepth 1 -maxdepth 1 -printf '%y\\t%s\\t%f\\n' | sort -t '\t' -k3"
)


@dataclass(frozen=True)
class CommandOutcome:
    exit_code: int | None
    output: str
    timed_out: bool
    truncated: bool
    duration_s: float


def _attempt(session: Session, attempt_id: int) -> Attempt:
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        raise NotFound(f"no attempt with id {attempt_id}")
    return attempt


def _records_transcript(attempt: Attempt) -> bool:
    participant = attempt.participant
    builtin = participant.agent_scaffold in set(scaffolds.names())
    return participant.kind is ParticipantKind.AGENT and not builtin


def _api_run(session: Session, attempt: Attempt) -> AgentRun:
    run = run_of(session, attempt.id)
    if run is None:
        run = AgentRun(
            attempt_id=attempt.id,
            scaffold=attempt.participant.agent_scaffold or API_SCAFFOLD,
            model=attempt.participant.agent_model or "",
            settings={"driver": "api"},
        )
        session.add(run)
        session.flush()
    return run


def _append(session: Session, attempt: Attempt, run_id: int, **values: Any) -> None:
    now = values.pop("ended_at", utcnow())
    append_entry(
        session, run_id, working_s=clock.attempt_working_s(attempt, now), ended_at=now, **values
    )


class WorkspaceCalls:
    """The workspace operations of one attempt, for one authenticated token."""

    def __init__(
        self,
        ctx: Context,
        attempt_id: int,
        token_id: int,
        backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
    ) -> None:
        self.ctx = ctx
        self.attempt_id = attempt_id
        self.token_id = token_id
        self.backend_factory = backend_factory

    # -- recording --

    def _audit(self, op: str, **details: Any) -> None:
        with self.ctx.session() as session:
            audit.record(session, f"attempt.workspace.{op}", "attempt", self.attempt_id, None,
                         token_id=self.token_id, **details)  # fmt: skip

    def _live(self, session: Session) -> Attempt:
        attempt = _attempt(session, self.attempt_id)
        if not schedule.is_live(attempt):
            raise Conflict(f"attempt {self.attempt_id} is {attempt.status.value}")
        return attempt

    def _workspace_tools(self, session: Session) -> tuple[WorkspaceTools, Any]:
        workspace = session.scalar(
            select(Workspace)
            .where(
                Workspace.attempt_id == self.attempt_id,
                Workspace.purpose == WorkspacePurpose.ATTEMPT,
                Workspace.status == WorkspaceStatus.RUNNING,
            )
            .order_by(Workspace.id.desc())
        )
        host = session.get(Host, workspace.host_id) if workspace and workspace.host_id else None
        if workspace is None or host is None:
            raise Conflict(f"attempt {self.attempt_id} has no running workspace")
        backend = self.backend_factory(host)
        handle = workspaces.handle_of(workspace)
        tools = WorkspaceTools(
            backend, handle, allowed=(), timeout_s=MAX_TIMEOUT_S, max_output_bytes=MAX_OUTPUT_BYTES
        )
        return tools, backend

    def _run(
        self, op: str, argv: list[str], timeout_s: float, arguments: dict[str, Any]
    ) -> ToolResult:
        """Run one command in the workspace, recorded before and after (as the loop does)."""
        call_id = f"api-{utcnow().strftime('%Y%m%dT%H%M%S%f')}"
        with self.ctx.session() as session:
            attempt = self._live(session)
            record = _records_transcript(attempt)
            run_id = _api_run(session, attempt).id if record else None
            if run_id is not None:
                _append(session, attempt, run_id, kind="tool_start", tool_call_id=call_id,
                        tool_name=op, content=json.dumps(arguments))  # fmt: skip
            tools, backend = self._workspace_tools(session)
        started = utcnow()
        try:
            result = tools.execute(argv, timeout_s=min(timeout_s, MAX_TIMEOUT_S))
        finally:
            close = getattr(backend, "close", None)
            if callable(close):
                close()
        with self.ctx.session() as session:
            attempt = _attempt(session, self.attempt_id)
            if run_id is not None:
                digest = None
                if result.truncated:
                    from baseline.attempts.snapshots import store_for

                    digest = store_for(self.ctx).put_bytes(result.output)
                _append(session, attempt, run_id, kind="message", role="tool", content=result.text,
                        tool_call_id=call_id, tool_name=op, exit_code=result.exit_code,
                        timed_out=result.timed_out, output_sha256=digest,
                        output_bytes=len(result.output), started_at=started)  # fmt: skip
            audit.record(session, f"attempt.workspace.{op}", "attempt", self.attempt_id, None,
                         token_id=self.token_id, exit_code=result.exit_code,
                         timed_out=result.timed_out, **arguments)  # fmt: skip
        if run_id is not None:  # an agent's step: the monitor looks at it now
            blacklist_monitor.watch(self.ctx, self.attempt_id)
        return result

    # -- the operations --

    def exec(self, command: str, timeout_s: float) -> CommandOutcome:
        result = self._run("exec", ["bash", "-c", command], timeout_s, {"command": command})
        return _outcome(result)

    def read_file(self, path: str) -> tuple[bytes, bool]:
        script = (
            'test -f "$1" || { echo "no such file: $1" >&2; exit 2; }; '
            'test -r "$1" || { echo "permission denied: $1" >&2; exit 3; }; cat -- "$1"'
        )
        result = self._run("read_file", ["bash", "-c", script, "read", path], 120.0,
                           {"path": path})  # fmt: skip
        if result.exit_code != 0:
            message = result.output.decode("utf-8", errors="replace").strip()[:500]
            # A file the workspace user may not read exists: 403, not "not found".
            raise (Forbidden if result.exit_code == 3 else NotFound)(message)
        return result.output, len(result.output) >= MAX_OUTPUT_BYTES

    def write_file(self, path: str, content: bytes, append: bool) -> int:
        if len(content) > MAX_WRITE_BYTES:
            raise InvalidInput(f"at most {MAX_WRITE_BYTES} bytes per write (append the rest)")
        encoded = base64.b64encode(content).decode()
        mode = "append" if append else "write"
        result = self._run("write_file", ["bash", "-c", WRITE_SCRIPT, "write", path, encoded, mode],
                           120.0, {"path": path, "bytes": len(content), "mode": mode})  # fmt: skip
        if result.exit_code != 0:
            raise Conflict(result.output.decode("utf-8", errors="replace").strip()[:500])
        return len(content)

    def list_dir(self, path: str) -> list[dict[str, Any]]:
        result = self._run("list", ["bash", "-c", LIST_SCRIPT, "list", path], 120.0,
                           {"path": path})  # fmt: skip
        if result.exit_code != 0:
            raise NotFound(result.output.decode("utf-8", errors="replace").strip()[:500])
        entries = []
        for line in result.output.decode("utf-8", errors="replace").splitlines():
            kind, _, rest = line.partition("\t")
            size, _, name = rest.partition("\t")
            entries.append({"name": name, "type": _KINDS.get(kind, "other"),
                            "size": int(size) if size.isdigit() else 0})  # fmt: skip
        return entries

    def status(self) -> dict[str, Any]:
        with self.ctx.session() as session:
            attempt = _attempt(session, self.attempt_id)
            state = clock.state(attempt)
            upcoming = [p for p in schedule.pending_points(attempt)
                        if p.due_working_s > state.working_s]  # fmt: skip
            human = attempt.participant.kind is ParticipantKind.HUMAN
            body = {
                "attempt_id": attempt.id,
                "status": attempt.status.value,
                "working_s": state.working_s,
                "limit_s": state.limit_s,
                "remaining_s": state.remaining_s,
                "paused": state.paused,
                "pause_reason": state.pause_reason.value if state.pause_reason else None,
                "next_checkpoint_working_s": upcoming[0].due_working_s if upcoming else None,
                "pauses": [
                    {
                        "reason": p.reason.value,
                        "started_at": p.started_at,
                        "ended_at": p.ended_at,
                        "note": p.note or "",
                    }
                    for p in sorted(attempt.pauses, key=lambda p: p.started_at)
                ],
                "can_pause": human,
                "can_score": attempt.task.kind is TaskKind.SCORED,
            }
            audit.record(session, "attempt.workspace.status", "attempt", self.attempt_id, None,
                         token_id=self.token_id)  # fmt: skip
        return body

    def _human(self, session: Session) -> Attempt:
        attempt = self._live(session)
        if attempt.participant.kind is not ParticipantKind.HUMAN:
            raise Forbidden("pause and resume are for human participants; an agent's clock runs")
        return attempt

    def pause(self, note: str) -> None:
        with self.ctx.session() as session:
            self._human(session)
        attempts.pause(self.ctx, self.attempt_id, PauseReason.PARTICIPANT, None,
                       note=note or "task pause")  # fmt: skip
        self._audit("pause", note=note)

    def resume(self) -> None:
        with self.ctx.session() as session:
            attempt = self._human(session)
            current = clock.open_pause(attempt)
            if current is not None and current.reason is not PauseReason.PARTICIPANT:
                raise Forbidden(
                    f"this pause ({current.reason.value}) was set by the study team; they resume it"
                )
        attempts.resume(self.ctx, self.attempt_id, None)
        self._audit("resume")

    def note(self, text: str) -> None:
        with self.ctx.session() as session:
            attempt = self._live(session)
            if _records_transcript(attempt):
                run = _api_run(session, attempt)
                _append(session, attempt, run.id, kind="notice", content=f"note: {text}")
        self._audit("note", text=text)

    def score(self) -> dict[str, Any]:
        with self.ctx.session() as session:
            attempt = self._live(session)
            if attempt.task.kind is not TaskKind.SCORED:
                raise Conflict("this task has no intermediate scores (it is not a scored task)")
        log = script_scoring.intermediate_score(self.ctx, self.attempt_id, None,
                                                backend_factory=self.backend_factory)  # fmt: skip
        self._audit("score", score_log_id=log.id, error=log.error)
        return {"score": log.normalised_score, "raw_score": log.raw_score, "error": log.error,
                "working_s": log.working_s}  # fmt: skip

    def submit(self) -> tuple[int, int]:
        with self.ctx.session() as session:
            self._live(session)
        final = attempts.submit(self.ctx, self.attempt_id, None, resolve_source)
        with self.ctx.session() as session:
            run = run_of(session, self.attempt_id)
            if run is not None and run.scaffold not in set(scaffolds.names()):
                run.status, run.end_reason, run.ended_at = (
                    AgentRunStatus.FINISHED,
                    "submitted",
                    utcnow(),
                )
        self._audit("submit", snapshot_id=final.id)
        return final.id, final.file_count


_KINDS = {"f": "file", "d": "directory", "l": "link"}


def _outcome(result: ToolResult) -> CommandOutcome:
    return CommandOutcome(
        exit_code=result.exit_code,
        output=result.output.decode("utf-8", errors="replace"),
        timed_out=result.timed_out,
        truncated=len(result.output) >= MAX_OUTPUT_BYTES,
        duration_s=result.duration_s,
    )
