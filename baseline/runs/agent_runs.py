"""Running a built-in agent on an attempt: the loop, its clock, its limits and its transcript.

The agent attempt is the same object as a human one: the same launched workspace, clock,
checkpoints and final snapshot. What this use case adds is the driver. It asks the model (through
`agents.model`), runs each tool call inside the workspace (through `agents.tools` and the backend)
and writes every step to the transcript *before* acting on it, which is what makes a run survive
its worker (`agent_worker`): `run_agent` on an attempt whose run is still RUNNING resumes from the
stored transcript. A tool call whose start was recorded but whose result was not is never run again
(it may have changed the workspace); the agent is told it was interrupted.

Time: the clock is the attempt's (`baseline.attempts.clock`). A failing model call (429, 5xx,
time-out) opens a ``rate_limit`` pause at that call's start; the pause ends at the start of the
call that succeeds, so the provider's outage is not charged (what Vivaria does). When the study
does not count generation time (``generation_counts`` False), each model call is a ``generation``
pause. The working-time limit and the wall-clock cap end the attempt through
`baseline.attempts.schedule`, which also takes the checkpoints that fall due while the agent works;
token and cost limits end it too. An ended attempt's workspace is stopped (its GPUs freed), and so
is the workspace of a run that failed (`attempts.agent_run_failed`): no attempt gets a second run.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from agents import context_window
from agents import scaffold as scaffolds
from agents.model import CallOutcome, ModelClient
from agents.scaffold import Scaffold, TaskBrief, TimeStatus
from agents.settings import AgentSettings, SettingsError, from_flat
from agents.tools import WorkspaceTools
from baseline.attempts import attempts, clock, schedule
from baseline.attempts.snapshots import resolve_source, store_for
from baseline.context import Context
from baseline.errors import Conflict, InvalidInput, NotFound
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    AgentRun,
    AgentRunStatus,
    Attempt,
    AttemptStatus,
    Host,
    ModelCall,
    ParticipantKind,
    PauseReason,
    TranscriptEntry,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.runs import blacklist_monitor, driver_clock, driver_lease
from baseline.runs.transcripts import (
    append_entry,
    context_rows,
    conversation,
    message_of,
    run_of,
)
from baseline.tasks.tasks import task_files
from baseline.workspaces import workspaces
from infra.workspace import PAPER_DIR, WorkspaceError

log = logging.getLogger(__name__)

Enrolled = TypeVar("Enrolled")

ClientFactory = Callable[[Any], ModelClient]
OWN_PAUSES = frozenset({PauseReason.RATE_LIMIT, PauseReason.GENERATION})
INTERRUPTED = (
    "This tool call was interrupted: the worker running you restarted while it ran, so its "
    "outcome is unknown. It was not run again; check the workspace's state before going on."
)
ENDED_MEANWHILE = "The attempt ended while this tool call ran, and its workspace was stopped."


class AgentRunError(Conflict):
    """The run cannot go on (model endpoint failing past its retries, workspace gone)."""


@dataclass
class RunOutcome:
    run_id: int
    status: AgentRunStatus
    end_reason: str | None
    steps: int


def enrolled_settings(
    attempt: Attempt, parse: Callable[[str, str, dict[str, Any] | None], Enrolled]
) -> Enrolled:
    """The agent configuration enrolled for `attempt`, read by `parse` (a scaffold's settings or
    a command agent's); a human's attempt or unreadable settings are bad input."""
    participant = attempt.participant
    if participant.kind is not ParticipantKind.AGENT:
        raise InvalidInput(f"attempt {attempt.id} is a human's: no agent runs it")
    try:
        return parse(
            participant.agent_endpoint or "", participant.agent_model or "",
            participant.agent_limits,
        )  # fmt: skip
    except SettingsError as exc:
        raise InvalidInput(str(exc)) from exc


def settings_for(attempt: Attempt) -> AgentSettings:
    return enrolled_settings(attempt, from_flat)


def open_run(
    session: Session, attempt: Attempt, scaffold: str, model: str, recorded: dict[str, Any]
) -> tuple[AgentRun, bool]:
    """The attempt's agent run: the earlier one resumed (True) while it is running, else a new
    one recording `scaffold`, `model` and the settings it runs with. An ended run, or an attempt
    that is not live, is a conflict: no attempt ever gets a second run."""
    run = run_of(session, attempt.id)
    if run is not None:
        if run.status is not AgentRunStatus.RUNNING:
            raise Conflict(f"attempt {attempt.id}: its agent run is {run.status.value} already")
        run.resumes += 1
        return run, True
    if not schedule.is_live(attempt):
        raise Conflict(f"attempt {attempt.id} is {attempt.status.value}: launch it first")
    run = AgentRun(attempt_id=attempt.id, scaffold=scaffold, model=model, settings=recorded)
    session.add(run)
    session.flush()
    return run, False


def brief_for(attempt: Attempt, files: list[str], instructions: str | None) -> TaskBrief:
    """The task as the agent is told it: the participant-visible files, and their instructions."""
    paths = tuple(f"{PAPER_DIR}/{p}" for p in files)
    text = instructions or (
        f"Reproduce the paper in {PAPER_DIR} (start with paper.md and addendum.md). Write your "
        "code in /home/submission with a reproduce.sh that runs it and writes its results."
    )
    return TaskBrief(title=attempt.task.title, instructions=text, files=paths)


# -- the loop -------------------------------------------------------------------------------


@dataclass
class AgentLoop:
    """Drives one attempt's agent; make a new one to resume (it reads the stored transcript)."""

    ctx: Context
    attempt_id: int
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host
    client_factory: ClientFactory = ModelClient
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)
    # Raises `DriverLost` once another driver took the attempt's lease: checked before every
    # transcript write, so a driver that lost the attempt never writes or acts for it again.
    still_driving: Callable[[], None] = driver_lease.unchecked
    # The same confirmed in the database (`driver_lease.Lease.fence`) right before each model
    # call: `still_driving` knows only what the lease's renewer found up to 15 s ago, and a
    # driver taken over meanwhile would pay for a call its successor makes again.
    fence: Callable[[], None] = driver_lease.unchecked

    def __post_init__(self) -> None:
        self.store = store_for(self.ctx)
        with self.ctx.session() as session:
            attempt = self._attempt(session)
            self.settings = settings_for(attempt)
            self.scaffold: Scaffold = self._scaffold(attempt)
            self.time_scale = attempt.time_scale
            # Kept for the whole run, a resumed one too: the scaffold's reminders depend on the
            # task (an EXP-Bench task's instructions forbid the git a reminder would ask for).
            self.brief = self._brief(attempt)

    # -- setup --

    def _attempt(self, session: Session) -> Attempt:
        attempt = session.get(Attempt, self.attempt_id)
        if attempt is None:
            raise NotFound(f"no attempt with id {self.attempt_id}")
        return attempt

    def _scaffold(self, attempt: Attempt) -> Scaffold:
        try:
            return scaffolds.get(attempt.participant.agent_scaffold or "")
        except scaffolds.UnknownScaffold as exc:
            raise InvalidInput(str(exc.args[0])) from exc

    def _open_run(self) -> tuple[int, bool]:
        """The attempt's run (created on the first call); True when an earlier one is resumed."""
        with self.ctx.session() as session:
            attempt = self._attempt(session)
            run, resumed = open_run(
                session, attempt, self.scaffold.name, self.settings.model.model,
                self.settings.model_dump(mode="json"),
            )  # fmt: skip
            if resumed:
                return run.id, True
            limit = attempt.working_time_limit_s
            run_id = run.id
        self._record(run_id, "message", role="system",
                     content=self.scaffold.system_prompt(self.brief, limit))  # fmt: skip
        self._record(run_id, "message", role="user", content=self.scaffold.task_message(self.brief))
        return run_id, False

    def _brief(self, attempt: Attempt) -> TaskBrief:
        files = [f.path for f in task_files(attempt.task)]
        instructions = None
        if "instructions.md" in files:
            from baseline.tasks.tasks import read_task_file

            instructions = read_task_file(self.store, attempt.task, "instructions.md").decode(
                "utf-8", errors="replace"
            )
        return brief_for(attempt, files, instructions)

    # -- persistence --

    def _record(self, run_id: int, kind: str, **values: Any) -> clock.ClockState:
        """Append one entry in its own transaction (so it survives whatever comes next); the
        clock at the entry comes back, which spares the caller another read."""
        self.still_driving()
        now = utcnow()
        values.setdefault("started_at", now)
        values.setdefault("ended_at", now)
        with self.ctx.session() as session:
            attempt = self._attempt(session)
            state = clock.state(attempt, values["ended_at"])
            append_entry(session, run_id, kind=kind, working_s=state.working_s, **values)
            return state

    def _ledger(self, run_id: int, call: CallOutcome) -> None:
        with self.ctx.session() as session:
            attempt = self._attempt(session)
            session.add(
                ModelCall(
                    study_id=attempt.study_id,
                    attempt_id=attempt.id,
                    purpose="agent",
                    model=self.settings.model.model,
                    prompt_tokens=call.prompt_tokens,
                    completion_tokens=call.completion_tokens,
                    cost_usd=call.cost_usd,
                    created_at=call.ended_at,
                )
            )
            run = session.get(AgentRun, run_id)
            assert run is not None
            run.prompt_tokens += call.prompt_tokens
            run.completion_tokens += call.completion_tokens
            run.cost_usd += call.cost_usd

    def _finish_run(self, run_id: int, status: AgentRunStatus, reason: str) -> None:
        with self.ctx.session() as session:
            run = session.get(AgentRun, run_id)
            assert run is not None
            run.status = status
            run.end_reason = reason
            run.ended_at = utcnow()

    # -- the clock --

    def _clock(self) -> tuple[clock.ClockState, Attempt | None]:
        with self.ctx.session() as session:
            attempt = self._attempt(session)
            state = clock.state(attempt)
            current = clock.open_pause(attempt)
            foreign = current is not None and current.reason not in OWN_PAUSES
            live = schedule.is_live(attempt)
            session.expunge(attempt)
        return state, (attempt if live and not foreign else None)

    def _own_pause(self) -> PauseReason | None:
        with self.ctx.session() as session:
            current = clock.open_pause(self._attempt(session))
            return current.reason if current is not None else None

    def _pause(self, reason: PauseReason, at: datetime, note: str) -> None:
        if self._own_pause() is not None:
            return  # the clock is paused already (ours from before a restart, or a coordinator's)
        try:
            attempts.pause(self.ctx, self.attempt_id, reason, None, note=note, now=at)
        except Conflict as exc:  # ended or paused meanwhile: nothing to pause
            log.info("attempt %s: no %s pause: %s", self.attempt_id, reason.value, exc)

    def _resume(self, reasons: frozenset[PauseReason], at: datetime) -> None:
        if self._own_pause() not in reasons:
            return
        try:
            attempts.resume(self.ctx, self.attempt_id, None, now=at)
        except Conflict as exc:
            log.info("attempt %s: pause not ended: %s", self.attempt_id, exc)

    # -- the model --

    def _backoff(self, failures: int) -> float:
        ceiling = min(self.settings.backoff_max_s, self.settings.backoff_initial_s * 2**failures)
        return ceiling * (0.5 + 0.5 * self.rng.random())

    def _ask(self, run_id: int, client: ModelClient, tools: list[dict[str, Any]]) -> CallOutcome:
        """One successful model call, retrying failures under a rate_limit pause and dropping
        the oldest exchanges when the conversation overflows the context."""
        failures = 0
        while True:
            with self.ctx.session() as session:
                messages = conversation(session, run_id)
            if not self.settings.generation_counts:
                self._pause(PauseReason.GENERATION, utcnow(), "model generation")
            self.fence()
            call = client.complete(messages, tools)
            self._ledger(run_id, call)
            if call.ok:
                # Generation that does not count ends the outage's pause at its end, not start.
                outage_end = call.started_at if self.settings.generation_counts else call.ended_at
                self._resume(frozenset({PauseReason.RATE_LIMIT}), outage_end)
                self._resume(frozenset({PauseReason.GENERATION}), call.ended_at)
                return call
            self._resume(frozenset({PauseReason.GENERATION}), call.ended_at)
            self._record(run_id, "model_error", content=call.error, started_at=call.started_at,
                         ended_at=call.ended_at)  # fmt: skip
            if call.context_overflow:
                if not self._truncate(run_id):
                    raise AgentRunError("the task's opening messages alone overflow the context")
                continue
            failures += 1
            if not call.retryable or failures >= self.settings.max_call_attempts:
                raise AgentRunError(f"model call failed after {failures} attempt(s): {call.error}")
            self._pause(PauseReason.RATE_LIMIT, call.started_at, call.error or "model call failed")
            self.sleep(self._backoff(failures - 1))

    def _truncate(self, run_id: int) -> bool:
        with self.ctx.session() as session:
            rows = context_rows(session, run_id)
            messages = [message_of(r) for r in rows]
            kept = context_window.truncate(messages)
            if len(kept) == len(messages):
                return False
            keep_ids = {id(m) for m in kept}
            dropped = 0
            for row, message in zip(rows, messages, strict=True):
                if id(message) not in keep_ids:
                    row.in_context = False
                    dropped += 1
        self._record(run_id, "notice",
                     content=f"context overflow: {dropped} oldest messages dropped")  # fmt: skip
        return True

    # -- tools --

    def _workspace_tools(self) -> tuple[WorkspaceTools, Any]:
        with self.ctx.session() as session:
            workspace = self._workspace(session)
            host = session.get(Host, workspace.host_id) if workspace.host_id else None
            if not host:
                raise AgentRunError(f"workspace {workspace.name} has no host")
            backend = self.backend_factory(host)
            handle = workspaces.handle_of(workspace)
        tools = WorkspaceTools(
            backend,
            handle,
            allowed=self.scaffold.tools,
            timeout_s=self.settings.tool_timeout_s,
            shown_bytes=self.settings.shown_output_bytes,
        )
        return tools, backend

    def _workspace(self, session: Session) -> Workspace:
        workspace = session.scalar(
            select(Workspace)
            .where(
                Workspace.attempt_id == self.attempt_id,
                Workspace.purpose == WorkspacePurpose.ATTEMPT,
                Workspace.status != WorkspaceStatus.DESTROYED,
            )
            .order_by(Workspace.id.desc())
        )
        if workspace is None:
            raise AgentRunError(f"attempt {self.attempt_id} has no live workspace")
        return workspace

    def _restart_workspace(self, error: str) -> str:
        """Restart the workspace a tool call found failing; Conflict when it was destroyed or
        stopped meanwhile (the attempt ended: `workspaces.revive`)."""
        with self.ctx.session() as session:
            workspace = self._workspace(session)
            workspaces.revive(session, workspace, error, self.backend_factory)
        return (
            "The workspace stopped and was restarted on its submission volume: files in "
            "/home/submission are kept, running processes and other files were lost. "
            "This tool call did not complete."
        )

    def _live(self) -> bool:
        with self.ctx.session() as session:
            return schedule.is_live(self._attempt(session))

    def _run_tool(self, run_id: int, tools: WorkspaceTools, call: dict[str, Any]) -> bool:
        """Run one tool call and record it; True when the agent ended the task.

        A workspace that fails under the call is restarted, unless the attempt ended meanwhile
        (the scheduler ended it at its limit and stopped its workspace): then the call's reply
        says so and the loop ends the run with the attempt."""
        name = str(call.get("function", {}).get("name", ""))
        arguments = str(call.get("function", {}).get("arguments", ""))
        state = self._record(run_id, "tool_start", tool_call_id=call["id"], tool_name=name,
                             content=arguments)  # fmt: skip
        left_wall_s = max(state.remaining_s / self.time_scale, 1.0)
        started = utcnow()
        try:
            result = tools.run(name, arguments, timeout_s=left_wall_s)
            text, output = result.text, result.output
        except WorkspaceError as exc:
            if self._live():
                log.warning("attempt %s: tool call failed: %s", self.attempt_id, exc)
                try:
                    text = self._restart_workspace(f"tool call failed: {exc}")
                except Conflict:  # its workspace destroyed meanwhile: the attempt ended
                    text = ENDED_MEANWHILE
            else:
                text = ENDED_MEANWHILE
            output, result = b"", None
        digest = None
        if result is not None and result.truncated:
            digest = self.store.put_bytes(output)
        self._record(
            run_id,
            "message",
            role="tool",
            content=text,
            tool_call_id=call["id"],
            tool_name=name,
            exit_code=None if result is None else result.exit_code,
            timed_out=bool(result and result.timed_out),
            output_sha256=digest,
            output_bytes=len(output),
            started_at=started,
            ended_at=utcnow(),
        )
        return bool(result and result.ends_task)

    def _pending_calls(self, run_id: int) -> tuple[list[dict[str, Any]], set[str]]:
        """The last assistant message's calls without a result, and which of them had started."""
        with self.ctx.session() as session:
            rows = list(
                session.scalars(
                    select(TranscriptEntry)
                    .where(TranscriptEntry.run_id == run_id)
                    .order_by(TranscriptEntry.seq)
                )
            )
        last = next((r for r in reversed(rows) if r.role == "assistant"), None)
        if last is None or not last.tool_calls:
            return [], set()
        answered = {r.tool_call_id for r in rows if r.role == "tool" and r.seq > last.seq}
        started = {
            r.tool_call_id or "" for r in rows if r.kind == "tool_start" and r.seq > last.seq
        }
        pending = [c for c in last.tool_calls if c["id"] not in answered]
        return pending, started

    # -- driving --

    def run(self, max_steps: int | None = None) -> RunOutcome:
        """Run (or resume) until the task ends, time runs out or a limit is reached.

        `max_steps` stops this call after that many model steps with the run still RUNNING, as
        a worker stopping would (the next call resumes it).
        """
        run_id, resumed = self._open_run()
        driver_clock.driving_starts(self.ctx, self.attempt_id)
        client = self.client_factory(self.settings.model)
        tools, backend = self._workspace_tools()
        try:
            return self._drive(run_id, resumed, client, tools, max_steps)
        except AgentRunError as exc:
            self._finish_run(run_id, AgentRunStatus.FAILED, str(exc))
            attempts.agent_run_failed(self.ctx, self.attempt_id, self.backend_factory)
            raise
        finally:
            client.close()
            close = getattr(backend, "close", None)
            if callable(close):
                close()

    def _drive(
        self,
        run_id: int,
        resumed: bool,
        client: ModelClient,
        tools: WorkspaceTools,
        max_steps: int | None,
    ) -> RunOutcome:
        if resumed:
            pending, started = self._pending_calls(run_id)
            self._record(run_id, "notice", content="resumed after a worker restart")
            for pending_call in pending:
                if pending_call["id"] in started:
                    name = pending_call.get("function", {}).get("name")
                    self._record(
                        run_id, "message", role="tool", content=INTERRUPTED,
                        tool_call_id=pending_call["id"], tool_name=name,
                    )  # fmt: skip
                elif self._run_tool(run_id, tools, pending_call):
                    return self._submit(run_id)
        steps_here = 0
        while True:
            schedule.run_due(self.ctx, self.attempt_id, resolve_source,
                             backend_factory=self.backend_factory)  # fmt: skip
            state, attempt = self._clock()
            with self.ctx.session() as session:
                run = session.get(AgentRun, run_id)
                assert run is not None
                steps, tokens = run.steps, run.prompt_tokens + run.completion_tokens
                cost = run.cost_usd
                status = self._attempt(session).status
            if status not in LIVE_ATTEMPT_STATUSES:
                return self._done(run_id, f"attempt {status.value}", steps)
            if attempt is None:  # paused by a coordinator: wait, the clock is stopped
                self.sleep(self.settings.pause_poll_s)
                continue
            limit = self._limit_hit(tokens, cost)
            if limit is not None:
                schedule.finish(self.ctx, self.attempt_id, AttemptStatus.ENDED, limit,
                                None, self._source(), None,
                                backend_factory=self.backend_factory)  # fmt: skip
                return self._done(run_id, limit, steps)
            if max_steps is not None and steps_here >= max_steps:
                return RunOutcome(run_id, AgentRunStatus.RUNNING, None, steps)
            call = self._ask(run_id, client, tools.specs())
            assert call.message is not None
            self._record(
                run_id,
                "message",
                role="assistant",
                content=call.message.get("content"),
                tool_calls=call.message.get("tool_calls"),
                prompt_tokens=call.prompt_tokens,
                completion_tokens=call.completion_tokens,
                cost_usd=call.cost_usd,
                started_at=call.started_at,
                ended_at=call.ended_at,
            )
            steps += 1
            steps_here += 1
            with self.ctx.session() as session:
                run = session.get(AgentRun, run_id)
                assert run is not None
                run.steps = steps
            ended = False
            for tool_call in call.message.get("tool_calls") or []:
                if self._run_tool(run_id, tools, tool_call):
                    ended = True
                    break
            blacklist_monitor.watch(self.ctx, self.attempt_id)  # this step's transcript, egress
            if ended:
                return self._submit(run_id)
            if not call.message.get("tool_calls"):
                self._record(run_id, "message", role="user",
                             content=self.scaffold.continue_message(self.brief))  # fmt: skip
            if steps % self.settings.reminder_every_steps == 0:
                state, _ = self._clock()
                time_status = TimeStatus(state.working_s, state.limit_s)
                reminder = self.scaffold.reminder(self.brief, time_status)
                self._record(run_id, "message", role="user", content=reminder)

    def _limit_hit(self, tokens: int, cost: float) -> str | None:
        if self.settings.token_limit is not None and tokens >= self.settings.token_limit:
            return f"token limit reached ({tokens} >= {self.settings.token_limit})"
        if self.settings.cost_limit_usd is not None and cost >= self.settings.cost_limit_usd:
            return f"cost limit reached (${cost:.4f} >= ${self.settings.cost_limit_usd})"
        return None

    def _source(self) -> Any:
        with self.ctx.session() as session:
            return resolve_source(session, self._attempt(session))

    def _submit(self, run_id: int) -> RunOutcome:
        """The agent ended the task. Its attempt may have ended meanwhile (its working-time limit
        fell due while the ending tool call ran, and the scheduler took the final snapshot):
        then the run ends with the attempt, as at the top of the loop, not with a traceback."""
        try:
            attempts.submit(self.ctx, self.attempt_id, None, resolve_source,
                            backend_factory=self.backend_factory)  # fmt: skip
            reason = "the agent ended the task"
        except Conflict:
            with self.ctx.session() as session:
                status = self._attempt(session).status
            if status in LIVE_ATTEMPT_STATUSES:
                raise
            reason = f"attempt {status.value} before the agent's submission"
        with self.ctx.session() as session:
            run = session.get(AgentRun, run_id)
            assert run is not None
            steps = run.steps
        return self._done(run_id, reason, steps)

    def _done(self, run_id: int, reason: str, steps: int) -> RunOutcome:
        self._finish_run(run_id, AgentRunStatus.FINISHED, reason)
        return RunOutcome(run_id, AgentRunStatus.FINISHED, reason, steps)
