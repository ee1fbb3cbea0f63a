"""Agent runs under faults, on the real Docker Engine with the scripted fake model: a phase of
429 and 500 answers (a rate_limit pause of exactly that span), a context overflow, a tool call
that never ends, and a worker stopped or killed mid-run (resumed, no tool call repeated)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from baseline.attempts import clock
from baseline.context import Context
from baseline.models import (
    AgentRunStatus,
    AttemptStatus,
    Host,
    PauseReason,
    TranscriptEntry,
    utcnow,
)
from baseline.runs import driver_lease
from baseline.runs.agent_runs import INTERRUPTED, AgentLoop
from baseline.runs.agent_worker import run_agent
from baseline.runs.transcripts import run_of
from infra.docker_backend import DockerBackend
from infra.workspace import DEFAULT_MAX_OUTPUT_BYTES, ExecResult, OutputSink, WorkspaceHandle
from tests.agents.agent_world import (
    Script,
    agent_attempt,
    attempt,
    bash,
    call,
    cleanup,
    entries,
    factory,
)
from tests.conftest import REPO
from tests.docker_env import TEST_LABELS, test_image
from tests.fake_openai import FakeOpenAI

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["cleanup", "test_image"]


def _workspace_file(ctx: Context, attempt_id: int, path: str) -> str:
    """A file of the attempt's workspace, copied out: the attempt has ended, so its container
    is stopped (kept with its submission)."""
    from baseline.models import Workspace
    from baseline.workspaces import workspaces

    with ctx.session() as session:
        workspace = session.scalars(select(Workspace).where(Workspace.attempt_id == attempt_id))
        handle = workspaces.handle_of(next(iter(workspace)))
    backend = DockerBackend.from_url(os.environ.get("BASELINE_TEST_DOCKER_URL",
                                                    "unix:///var/run/docker.sock"),
                                     labels=TEST_LABELS)  # fmt: skip
    try:
        archive = backend.get_archive(handle, path)
    finally:
        backend.close()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.extractfile(Path(path).name)
        assert member is not None
        return member.read().decode()


def test_rate_limits_and_server_errors_pause_the_clock_for_exactly_their_span(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    server: FakeOpenAI

    def first(body: dict[str, Any]) -> Any:
        server.fault_plan.extend(["429", "500", "429", "500"])  # the next four calls fail
        return bash("echo before")

    script = Script([first, bash("echo after"), call("end_task")])
    with FakeOpenAI(answer=script) as server:
        world = agent_attempt(ctx, test_image, server.base_url)
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
        assert server.faults == 4
    assert outcome.status is AgentRunStatus.FINISHED and outcome.steps == 3

    rows = entries(ctx, world.attempt_id)
    errors = [e for e in rows if e.kind == "model_error"]
    assert [e.content[:8] for e in errors if e.content] == ["HTTP 429", "HTTP 500"] * 2
    succeeded = next(e for e in rows if e.role == "assistant" and e.seq > errors[-1].seq)
    done = attempt(ctx, world.attempt_id)
    assert done.status is AttemptStatus.SUBMITTED
    pauses = [p for p in done.pauses if p.reason is PauseReason.RATE_LIMIT]
    assert len(pauses) == 1
    # From the failing call's start until the start of the call that succeeded.
    assert pauses[0].started_at == errors[0].started_at
    assert pauses[0].ended_at == succeeded.started_at
    span = (succeeded.started_at - errors[0].started_at).total_seconds()
    assert span > 0
    state = clock.state(done)
    # Besides the outage, only the wait for its driver (the clock starts when it drives).
    (waiting,) = [p for p in done.pauses if p.reason is PauseReason.NOT_STARTED]
    assert waiting.ended_at is not None
    span += (waiting.ended_at - waiting.started_at).total_seconds()
    assert state.paused_wall_s == pytest.approx(span)
    wall = ((done.ended_at or state.at) - (done.started_at or state.at)).total_seconds()
    assert state.working_s == pytest.approx((wall - span) * done.time_scale)


@pytest.mark.sqlite_only("the scaffold's context window")
def test_context_overflow_drops_the_oldest_exchanges_and_the_run_goes_on(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    noisy = bash("printf 'x%.0s' $(seq 1 2000)")  # 2000 characters: about 500 fake tokens
    script = Script([noisy] * 8 + [call("end_task")])
    with FakeOpenAI(answer=script, context_tokens=1_600) as server:
        world = agent_attempt(ctx, test_image, server.base_url)
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
        overflows = [r for r in server.requests if r.status == 400]
    assert outcome.status is AgentRunStatus.FINISHED and outcome.steps == 9
    assert overflows, "the conversation never overflowed: the test proves nothing"
    rows = entries(ctx, world.attempt_id)
    notices = [e for e in rows if e.kind == "notice" and "context overflow" in (e.content or "")]
    assert len(notices) >= 1
    assert not any(e.in_context for e in rows if e.role == "tool" and e.seq < 10)
    # Every request after a truncation kept the instructions and sent no orphaned tool reply.
    for body in script.bodies:
        messages = body["messages"]
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        assert messages[1]["content"].startswith("Task: ")
        calls = {c["id"] for m in messages for c in m.get("tool_calls") or []}
        assert all(m["tool_call_id"] in calls for m in messages if m["role"] == "tool")
    done = attempt(ctx, world.attempt_id)
    assert done.status is AttemptStatus.SUBMITTED
    assert not [p for p in done.pauses if p.reason is PauseReason.RATE_LIMIT]


@pytest.mark.sqlite_only("the tool's time-out in the workspace")
def test_a_tool_call_that_never_ends_times_out_and_the_agent_is_told(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    script = Script([bash("sleep 600"), call("end_task")])
    with FakeOpenAI(answer=script) as server:
        world = agent_attempt(ctx, test_image, server.base_url, settings={"tool_timeout_s": 2})
        started = time.monotonic()
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
        took = time.monotonic() - started
    assert outcome.status is AgentRunStatus.FINISHED
    assert took < 60
    reply = next(e for e in entries(ctx, world.attempt_id) if e.role == "tool")
    assert reply.timed_out and reply.exit_code is None
    assert "timed out after 2 s" in (reply.content or "")
    told = script.bodies[1]["messages"][-1]
    assert told["role"] == "tool" and "timed out after 2 s" in told["content"]


def _steps(n: int) -> list[Any]:
    return [bash(f"echo step-{i} >> /home/submission/steps.log") for i in range(1, n + 1)]


def test_a_stopped_worker_resumes_without_repeating_a_tool_call(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    script = Script([*_steps(6), call("end_task")])
    with FakeOpenAI(answer=script) as server:
        world = agent_attempt(ctx, test_image, server.base_url)
        first = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run(max_steps=3)
        assert first.status is AgentRunStatus.RUNNING and first.steps == 3
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
        assert server.calls == 7  # no step was asked twice either
    assert outcome.status is AgentRunStatus.FINISHED and outcome.steps == 7
    log = _workspace_file(ctx, world.attempt_id, "/home/submission/steps.log")
    assert log.split() == [f"step-{i}" for i in range(1, 7)]
    with ctx.session() as session:
        run = run_of(session, world.attempt_id)
        assert run is not None and run.resumes == 1


@pytest.mark.sqlite_only("the lease's conditional update is tested on both in test_driver_lease")
def test_a_loop_driver_taken_over_mid_run_asks_the_model_nothing_more(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    """The driver stalls past its lease during a model call and another driver takes the
    attempt over; the lease's renewer has not looked yet (every 15 s). Its next model call is
    fenced in the database first: it stops with `DriverLost` instead of paying for a call the
    new driver makes again."""
    first, *rest = _steps(3)

    def taken_over_meanwhile(body: dict[str, Any]) -> Any:
        driver_lease.acquire(
            ctx, world.attempt_id, "agent run B", now=utcnow() + timedelta(seconds=61)
        )
        return first

    script = Script([taken_over_meanwhile, *rest, call("end_task")])
    with FakeOpenAI(answer=script) as server:
        world = agent_attempt(ctx, test_image, server.base_url)
        with pytest.raises(driver_lease.DriverLost, match="taken over"):
            run_agent(ctx, world.attempt_id, backend_factory=factory)
        assert server.calls == 1
    log = _workspace_file(ctx, world.attempt_id, "/home/submission/steps.log")
    assert log.split() == ["step-1"]  # the step it was given ran, and nothing after it


class WorkerKilled(BaseException):
    """Stands for SIGKILL inside the process: nothing after it runs, no handler catches it."""


class KillAfterExec:
    """A backend that dies right after the n-th exec ran in the workspace (before its result is
    recorded): the worst moment, since the command's effect happened."""

    def __init__(self, inner: DockerBackend, at: int) -> None:
        self.inner, self.at, self.count = inner, at, 0
        self.name = inner.name

    def exec(
        self,
        handle: WorkspaceHandle,
        command: Sequence[str],
        *,
        timeout_s: float | None = None,
        user: str | None = None,
        workdir: str | None = None,
        on_output: OutputSink | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        result = self.inner.exec(
            handle, command, timeout_s=timeout_s, user=user, workdir=workdir,
            on_output=on_output, max_output_bytes=max_output_bytes,
        )  # fmt: skip
        self.count += 1
        if self.count == self.at:
            raise WorkerKilled
        return result

    def close(self) -> None:
        self.inner.close()


def test_a_tool_call_cut_off_by_a_kill_is_reported_not_rerun(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    def dying(host: Host) -> Any:
        return KillAfterExec(DockerBackend.from_url(host.docker_url, labels=TEST_LABELS), at=2)

    script = Script([*_steps(3), call("end_task")])
    with FakeOpenAI(answer=script) as server:
        world = agent_attempt(ctx, test_image, server.base_url)
        with pytest.raises(WorkerKilled):
            AgentLoop(ctx, world.attempt_id, backend_factory=dying).run()
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
    assert outcome.status is AgentRunStatus.FINISHED
    log = _workspace_file(ctx, world.attempt_id, "/home/submission/steps.log")
    assert log.split() == ["step-1", "step-2", "step-3"]  # step-2 ran once, before the kill
    replies = [e.content for e in entries(ctx, world.attempt_id) if e.role == "tool"]
    assert replies[1] == INTERRUPTED and len(replies) == 4


def _wait_for(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


def test_a_sigkilled_worker_process_resumes_without_repeating_a_tool_call(
    ctx: Context, cleanup: None, test_image: str, tmp_path: Path
) -> None:
    steps = [bash(f"sleep 0.3; echo step-{i} >> /home/submission/steps.log") for i in range(1, 9)]
    script = Script([*steps, call("end_task")])
    with FakeOpenAI(answer=script) as server:
        world = agent_attempt(ctx, test_image, server.base_url)
        worker = subprocess.Popen(
            [sys.executable, "-m", "tests.agents.agent_worker", ctx.settings.database_url,
             str(ctx.settings.home), str(world.attempt_id), TEST_LABELS["baseline.test-run"]],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip

        def tool_replies() -> int:
            with ctx.session() as session:
                return len(
                    session.scalars(
                        select(TranscriptEntry).where(TranscriptEntry.role == "tool")
                    ).all()
                )

        try:
            _wait_for(lambda: tool_replies() >= 3 or worker.poll() is not None, 120)
            assert worker.poll() is None, worker.communicate()[0].decode()[-2000:]
            worker.send_signal(signal.SIGKILL)
            worker.wait(30)
        finally:
            if worker.poll() is None:
                worker.kill()
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
    assert outcome.status is AgentRunStatus.FINISHED
    lines = _workspace_file(ctx, world.attempt_id, "/home/submission/steps.log").split()
    assert len(lines) == len(set(lines))  # no command ran twice
    rows = entries(ctx, world.attempt_id)
    started = [e.content or "" for e in rows if e.kind == "tool_start"]
    assert len(started) == len(set(started))  # no tool call was started twice
    completed = {e.tool_call_id for e in rows if e.role == "tool" and e.content != INTERRUPTED}
    ran = [e.content or "" for e in rows if e.kind == "tool_start" and e.tool_name == "bash"
           and e.tool_call_id in completed]  # fmt: skip
    for arguments in ran:  # every command that completed left its line, once
        assert sum(1 for line in lines if f"{line} >>" in arguments) == 1
    assert any(e.kind == "notice" and "resumed" in (e.content or "") for e in rows)


def test_a_dead_workspace_is_restarted_on_its_submission_and_the_agent_is_told(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    from baseline.models import Workspace
    from baseline.workspaces import workspaces

    def kill_the_container(body: dict[str, Any]) -> Any:
        with ctx.session() as session:
            row = session.scalars(select(Workspace).where(Workspace.attempt_id == attempt_id)).one()
            handle = workspaces.handle_of(row)
        backend = DockerBackend.from_url(os.environ.get("BASELINE_TEST_DOCKER_URL",
                                                        "unix:///var/run/docker.sock"),
                                         labels=TEST_LABELS)  # fmt: skip
        try:
            backend.stop(handle)
        finally:
            backend.close()
        return bash("echo lost")

    script = Script([
        bash("echo kept > /home/submission/kept.txt"),
        kill_the_container,
        bash("cat /home/submission/kept.txt"),
        call("end_task"),
    ])  # fmt: skip
    with FakeOpenAI(answer=script) as server:
        world = agent_attempt(ctx, test_image, server.base_url)
        attempt_id = world.attempt_id
        outcome = AgentLoop(ctx, attempt_id, backend_factory=factory).run()
    assert outcome.status is AgentRunStatus.FINISHED
    replies = [e.content or "" for e in entries(ctx, attempt_id) if e.role == "tool"]
    assert replies[1].startswith("The workspace stopped and was restarted on its submission")
    assert replies[2].startswith("kept")  # the submission survived the restart
    assert attempt(ctx, attempt_id).status is AttemptStatus.SUBMITTED
