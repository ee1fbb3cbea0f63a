"""The agent worker: drives every runnable agent attempt, a built-in scaffold's loop or a command
agent, each in its own thread; a restarted worker resumes the unfinished runs where their
transcripts end.

Above both kinds of run (`agent_runs`' loop, `command_agents`' command), which share the run
records of `agent_runs`, so that neither imports the other to dispatch.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from agents import command as command_agents
from agents import scaffold as scaffolds
from agents.command import SCAFFOLD as COMMAND_SCAFFOLD
from agents.model import ModelClient
from baseline.context import Context
from baseline.errors import InvalidInput, NotFound
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    AgentRun,
    AgentRunStatus,
    Attempt,
    Participant,
    ParticipantKind,
)
from baseline.runs import driver_clock, driver_lease
from baseline.runs.agent_runs import AgentLoop, ClientFactory, RunOutcome
from baseline.runs.command_agents import CommandAgent
from baseline.workspaces import egress_gateway, workspaces

log = logging.getLogger(__name__)


def run_agent(ctx: Context, attempt_id: int, role: str = "agent run", **kwargs: Any) -> RunOutcome:
    """Run or resume the agent of an agent attempt (its built-in loop, or its command) as its
    only driver: `DriverBusy`, naming the holder, while another driver (`role` names this one)
    holds the attempt's lease."""
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None:
            raise NotFound(f"no attempt with id {attempt_id}")
        scaffold = attempt.participant.agent_scaffold
    if not command_agents.worker_driven(scaffold):
        raise InvalidInput(
            f"attempt {attempt_id}: no worker drives it (its participant is "
            f"{'a human' if scaffold is None else f'an API agent, scaffold {scaffold!r}'})"
        )
    lease = driver_lease.hold(ctx, attempt_id, role)
    try:
        # Its proxy may have ended with the process that launched it: it listens before the
        # first step, and lives as long as this driver when started here.
        egress_gateway.ensure_attempt_proxy(ctx, attempt_id)
        if lease.dead_since is not None:  # took a dead driver's lease over: nobody drove since
            driver_clock.driving_starts(ctx, attempt_id, dead_since=lease.dead_since)
        if scaffold == COMMAND_SCAFFOLD:
            factory = kwargs.get("backend_factory", workspaces.backend_for_host)
            return CommandAgent(
                ctx, attempt_id, backend_factory=factory, still_driving=lease.fence
            ).run()
        return AgentLoop(
            ctx, attempt_id, still_driving=lease.check, fence=lease.fence, **kwargs
        ).run()
    finally:
        if not lease.lost:  # else the attempt's clock is its new driver's
            driver_clock.driving_stops(ctx, attempt_id)
        lease.close()


def running_attempts(ctx: Context) -> list[int]:
    """Attempts whose built-in agent's run is unfinished: what a restarted worker resumes (an
    API agent's run, `baseline.runs.workspace_api`, is driven from outside and never resumed
    here)."""
    with ctx.session() as session:
        return list(
            session.scalars(
                select(AgentRun.attempt_id).where(
                    AgentRun.status == AgentRunStatus.RUNNING,
                    AgentRun.scaffold.in_(list(scaffolds.names())),
                )
            )
        )


def runnable_attempts(ctx: Context) -> list[int]:
    """Started agent attempts (a built-in scaffold, or a command agent) whose run is unfinished
    or not begun."""
    with ctx.session() as session:
        rows = session.execute(
            select(Attempt.id, Participant.agent_scaffold, AgentRun.status)
            .join(Participant, Attempt.participant_id == Participant.id)
            .outerjoin(AgentRun, AgentRun.attempt_id == Attempt.id)
            .where(
                Participant.kind == ParticipantKind.AGENT,
                Attempt.started_at.is_not(None),
                Attempt.status.in_(list(LIVE_ATTEMPT_STATUSES)),
            )
            .order_by(Attempt.id)
        ).all()
    return [
        attempt_id
        for attempt_id, scaffold, status in rows
        if command_agents.worker_driven(scaffold) and status in (None, AgentRunStatus.RUNNING)
    ]


@dataclass
class Worker:
    """Drives every runnable agent attempt, each in its own thread; a restarted worker picks up
    the unfinished runs where their transcripts end."""

    ctx: Context
    concurrency: int = 8
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host
    client_factory: ClientFactory = ModelClient
    errors: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._active: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()

    def poll(self) -> list[int]:
        """Start the runnable attempts not driven yet (up to the concurrency); their ids."""
        started = []
        with self._lock:
            self._active = {a: t for a, t in self._active.items() if t.is_alive()}
            for attempt_id in runnable_attempts(self.ctx):
                if len(self._active) >= self.concurrency:
                    break
                if attempt_id in self._active or attempt_id in self.errors:
                    continue
                thread = threading.Thread(
                    target=self._drive, args=(attempt_id,), name=f"agent-{attempt_id}", daemon=True
                )
                self._active[attempt_id] = thread
                thread.start()
                started.append(attempt_id)
        return started

    def _drive(self, attempt_id: int) -> None:
        try:
            run_agent(
                self.ctx, attempt_id, "agent worker", backend_factory=self.backend_factory,
                client_factory=self.client_factory,
            )  # fmt: skip
        except (driver_lease.DriverBusy, driver_lease.DriverLost) as exc:
            # Another driver has the attempt (an `agent run`): not an error of the run; a later
            # poll drives it if it is still unfinished once that driver's lease is gone.
            log.info("attempt %s: %s", attempt_id, exc)
        except egress_gateway.EgressUnavailable as exc:  # nothing driven yet: the next poll
            log.warning("attempt %s waits for its egress proxy: %s", attempt_id, exc)
        except Exception as exc:  # recorded (the run is FAILED when the loop gave up)
            log.exception("agent of attempt %s stopped", attempt_id)
            self.errors[attempt_id] = f"{type(exc).__name__}: {exc}"

    def join(self) -> None:
        with self._lock:
            threads = list(self._active.values())
        for thread in threads:
            thread.join()
