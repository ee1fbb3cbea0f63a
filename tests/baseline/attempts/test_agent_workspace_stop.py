"""An agent's workspace stops once no agent will work in it again (issue 31 item 9): its attempt
ended (a submission, its limit, a disqualification) or its run failed. The container stops
(never removed: its submission volume is kept), its GPU goes back to the pool, and reconcile
leaves it stopped. Through a backend that records what it is asked, on a host with a GPU."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from agents.model import CallOutcome, ModelClient
from baseline.attempts import attempts, schedule
from baseline.context import Context
from baseline.models import (
    Attempt,
    AttemptStatus,
    AuditEvent,
    Host,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.runs.agent_runs import AgentLoop, AgentRunError
from baseline.workspaces import gpu_allocation, workspaces
from infra.workspace import ExecResult, WorkspaceError, WorkspaceHandle, WorkspaceState
from tests.baseline.attempt_world import directory_resolver, make_attempt

A10 = "NVIDIA A10"


@dataclass
class Recording:
    """A backend whose one container runs until it is stopped; what it was asked is kept."""

    name: str = "docker"
    state: WorkspaceState = WorkspaceState.RUNNING
    calls: list[str] = field(default_factory=list)

    def status(self, handle: WorkspaceHandle) -> WorkspaceState:
        return self.state

    def stop(self, handle: WorkspaceHandle) -> None:
        self.calls.append(f"stop {handle.name}")
        self.state = WorkspaceState.STOPPED

    def start(self, handle: WorkspaceHandle) -> None:
        self.calls.append(f"start {handle.name}")
        self.state = WorkspaceState.RUNNING

    def destroy(self, handle: WorkspaceHandle, *, keep_submission: bool = False) -> None:
        self.calls.append(f"destroy {handle.name}")

    def exec(self, handle: WorkspaceHandle, command: Sequence[str], **_: Any) -> ExecResult:
        if self.state is not WorkspaceState.RUNNING:
            raise WorkspaceError(f"{handle.name} is not running")
        return ExecResult(exit_code=0, output=b"", timed_out=False, duration_s=0.0)

    def reconcile(self, live_names: set[str], *, min_age_s: float = 0.0) -> list[str]:
        return []

    def close(self) -> None:
        pass


@dataclass
class World:
    attempt_id: int
    workspace_id: int
    backend: Recording
    resolver: Any

    def factory(self, host: Host) -> Any:
        return self.backend


def _world(ctx: Context, tmp_path: Path) -> World:
    """A started agent attempt (one working hour, real time) whose running workspace holds the
    host's one GPU."""
    attempt_id = make_attempt(ctx, limit_hours=1.0)
    resolver = directory_resolver(tmp_path)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.participant.agent_limits = {"input_usd_per_mtok": 0, "output_usd_per_mtok": 0}
    attempts.start(ctx, attempt_id, None, resolver)
    with ctx.session() as session:
        host = Host(
            name="gpu-host",
            docker_url="unix:///var/run/recording.sock",
            healthy=True,
            gpus=[{"index": 0, "uuid": "GPU-0", "model": A10}],
            gpus_declared=True,
        )
        session.add(host)
        session.flush()
        workspace = Workspace(
            attempt_id=attempt_id,
            purpose=WorkspacePurpose.ATTEMPT,
            host_id=host.id,
            backend="docker",
            name=f"ws-a{attempt_id}-test",
            image="img",
            hardware_profile="a10",
            status=WorkspaceStatus.RUNNING,
            submission_volume=f"ws-a{attempt_id}-test-submission",
        )
        session.add(workspace)
        session.flush()
        assert gpu_allocation.allocate(session, host, workspace, 1, "A10") is not None
        return World(attempt_id, workspace.id, Recording(), resolver)


class FailingModel(ModelClient):
    """A model endpoint that refuses every call for good (not worth a retry)."""

    def __init__(self, config: Any) -> None:
        pass  # no SDK client: nothing is sent

    def complete(self, messages: Any, tools: Any) -> CallOutcome:
        now = utcnow()
        return CallOutcome(now, now, None, 0, 0, 0.0, error="HTTP 400: no such model")

    def close(self) -> None:
        pass


def _submit(ctx: Context, world: World) -> None:
    attempts.submit(ctx, world.attempt_id, None, world.resolver, backend_factory=world.factory)


def _limit(ctx: Context, world: World) -> None:
    later = utcnow() + timedelta(hours=2)
    schedule.run_due(
        ctx, world.attempt_id, world.resolver, now=later, backend_factory=world.factory
    )


def _disqualify(ctx: Context, world: World) -> None:
    attempts.disqualify(ctx, world.attempt_id, None, "test", backend_factory=world.factory)


def _run_fails(ctx: Context, world: World) -> None:
    loop = AgentLoop(
        ctx, world.attempt_id, backend_factory=world.factory, client_factory=FailingModel
    )
    with pytest.raises(AgentRunError):
        loop.run()


ENDS: dict[str, tuple[Callable[[Context, World], None], AttemptStatus]] = {
    "submitted": (_submit, AttemptStatus.SUBMITTED),
    "working-time limit": (_limit, AttemptStatus.ENDED),
    "disqualified": (_disqualify, AttemptStatus.DISQUALIFIED),
    # The run is over (no attempt gets a second one); the clock runs on to the limit.
    "run failed": (_run_fails, AttemptStatus.RUNNING),
}


@pytest.mark.parametrize("end", list(ENDS))
def test_the_workspace_stops_and_frees_its_gpu_when_no_agent_will_work_in_it_again(
    ctx: Context, tmp_path: Path, end: str
) -> None:
    world = _world(ctx, tmp_path)
    act, status = ENDS[end]
    act(ctx, world)

    name = f"ws-a{world.attempt_id}-test"
    assert world.backend.calls == [f"stop {name}"]  # stopped, neither removed nor restarted
    with ctx.session() as session:
        attempt = session.get(Attempt, world.attempt_id)
        workspace = session.get(Workspace, world.workspace_id)
        host = session.scalar(select(Host).where(Host.name == "gpu-host"))
        assert attempt is not None and workspace is not None and host is not None
        assert attempt.status is status
        assert workspace.status is WorkspaceStatus.STOPPED
        assert gpu_allocation.live_assignments(session, workspace) == []
        assert [d.index for d in gpu_allocation.free_gpus(session, host)] == [0]
        stopped = session.scalars(
            select(AuditEvent.action).where(AuditEvent.target_id == str(world.workspace_id))
        ).all()
        assert "workspace.stop" in stopped
        # Reconcile leaves it stopped: restarted, it would hold a GPU no longer its own.
        report = workspaces.reconcile(session, world.factory)
        assert report.restarted == [] and report.died == []
        assert workspace.status is WorkspaceStatus.STOPPED
    assert world.backend.calls == [f"stop {name}"]


def test_a_workspace_that_cannot_be_stopped_keeps_its_gpu_and_the_failure_is_audited(
    ctx: Context, tmp_path: Path
) -> None:
    world = _world(ctx, tmp_path)

    def unreachable(host: Host) -> Any:
        raise workspaces.PlacementError(f"host {host.name}: no answer")

    attempts.submit(ctx, world.attempt_id, None, world.resolver, backend_factory=unreachable)
    with ctx.session() as session:
        workspace = session.get(Workspace, world.workspace_id)
        assert workspace is not None and workspace.status is WorkspaceStatus.RUNNING
        assert len(gpu_allocation.live_assignments(session, workspace)) == 1
        failed = session.scalars(
            select(AuditEvent).where(AuditEvent.action == "workspace.stop_failed")
        ).all()
        assert len(failed) == 1 and "no answer" in str(failed[0].details)


def test_a_disqualified_persons_workspace_is_frozen(ctx: Context, tmp_path: Path) -> None:
    """A disqualification ends a human's attempt as a submission does: the participant's
    processes are ended and the submission made read-only (issue 36 item 3, "an ended attempt of
    any kind"). Before, only an agent's workspace was seen to; a person's was left as it was."""
    attempt_id = make_attempt(ctx, human=True)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path))
    with ctx.session() as session:
        host = Host(name="host", docker_url="unix:///var/run/recording.sock", healthy=True)
        session.add(host)
        session.flush()
        session.add(
            Workspace(
                attempt_id=attempt_id, purpose=WorkspacePurpose.ATTEMPT, host_id=host.id,
                backend="docker", name=f"ws-h{attempt_id}", image="img", hardware_profile="cpu",
                status=WorkspaceStatus.RUNNING,
            )
        )  # fmt: skip
    backend = Execs()

    def factory(host: Host) -> Any:
        return backend

    attempts.disqualify(ctx, attempt_id, None, "copied a solution", factory)
    assert backend.commands[0][:2] == ["python3", "-c"]  # every process of the person killed
    assert backend.commands[1] == ["chmod", "-R", "a-w", "/home/submission"]
    with ctx.session() as session:
        actions = session.scalars(
            select(AuditEvent.action).where(AuditEvent.target_id == str(attempt_id))
        ).all()
    assert "workspace.freeze" in actions


@dataclass
class Execs(Recording):
    """A running container whose execs are kept."""

    commands: list[list[str]] = field(default_factory=list)

    def exec(self, handle: WorkspaceHandle, command: Sequence[str], **_: Any) -> ExecResult:
        self.commands.append(list(command))
        return super().exec(handle, command)
