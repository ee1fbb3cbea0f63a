"""A command agent's model request is answered, and the model paid for it, once. Before, two
drivers both answered one waiting relay request when one had lost its lease but lived.

The relay here is the real one (`agents/workspace_relay.py`: its server, its readers, the agent's
HTTP connection), run on this machine by `DirectoryWorkspace`, a workspace that is a folder: the
relay's fixed folder and port are rewritten to a temporary folder and a free port. The model is
the scripted OpenAI-compatible server, which counts the calls it receives.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from agents.settings import from_flat
from baseline.attempts.snapshots import store_for
from baseline.context import Context
from baseline.models import (
    AgentRun,
    AgentRunStatus,
    Attempt,
    AttemptStatus,
    Host,
    ModelCall,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.runs import agent_worker, driver_lease, model_keys
from baseline.runs.command_agents import RELAY_DIR, RELAY_PORT, RelayChannel
from baseline.runs.model_passthrough import Passthrough, ProxyRequest, ProxyResponse
from infra.workspace import ExecResult, OutputSink, WorkspaceHandle
from tests.baseline.attempt_world import make_attempt, running_command_run
from tests.fake_openai import FakeOpenAI
from tests.ports import free_port

pytestmark = pytest.mark.sqlite_only  # the lease's conditional UPDATEs have their own tests

HANDLE = WorkspaceHandle("relay-here", "local", "relay-here", None, "relay-here-sub")
PRICES = {"input_usd_per_mtok": 2.0, "output_usd_per_mtok": 8.0}


class DirectoryWorkspace:
    """The two channels `RelayChannel` uses (exec with a streamed output, copy-in), on this
    machine: a script's relay folder and port become `root`'s and `port`."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.relay = root / RELAY_DIR.lstrip("/")

    def _local(self, text: str) -> str:
        text = text.replace(RELAY_DIR, str(self.relay)).replace(str(RELAY_PORT), str(self.port))
        return text.replace("python3 -u", f"{sys.executable} -u")

    def exec(
        self, handle: WorkspaceHandle, argv: list[str], *, user: str = "root",
        on_output: OutputSink | None = None, max_output_bytes: int = 4096, timeout_s: float = 60,
    ) -> ExecResult:  # fmt: skip
        started = time.monotonic()
        # Unbuffered: a read returns what the relay's reader wrote so far, as a stream does.
        process = subprocess.Popen([self._local(a) for a in argv], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, bufsize=0)  # fmt: skip
        assert process.stdout is not None
        output = b""
        while chunk := process.stdout.read(4096):
            if on_output is not None:
                on_output(chunk)
            output += chunk
        code = process.wait()
        return ExecResult(code, output, False, time.monotonic() - started)

    def put_archive(self, handle: WorkspaceHandle, path: str, archive: bytes) -> None:
        target = Path(self._local(path)) if path != "/opt" else self.root / "opt"
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(target, filter="data")


@pytest.fixture
def model() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer=lambda body: "the one answer") as server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[DirectoryWorkspace]:
    here = DirectoryWorkspace(tmp_path / "ws", free_port())
    yield here
    # The relay's server is detached, and a failed test may leave a reader: end them (their pid
    # files name the processes this test started).
    for pid_file in (here.relay / "serve.pid", here.relay / "stream.pid"):
        pid = pid_file.read_text().strip() if pid_file.exists() else ""
        with contextlib.suppress(OSError):  # gone already (and its pid not reused: relay.py)
            if pid and b"relay.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(int(pid), signal.SIGTERM)


def _passthrough(ctx: Context, model: FakeOpenAI) -> tuple[Passthrough, str]:
    attempt_id, run_id = running_command_run(ctx)
    with ctx.session() as session:
        key = model_keys.issue(session, attempt_id)
    settings = from_flat(model.base_url, "pinned-model", PRICES)
    proxy = Passthrough(ctx, attempt_id, run_id, settings, store_for(ctx),
                        environ={"OPENAI_API_KEY": "sk-provider"})  # fmt: skip
    return proxy, key


class Agent:
    """The agent's model calls: each an HTTP request to the relay, waiting for its answer."""

    def __init__(self, workspace: DirectoryWorkspace, key: str) -> None:
        self.url = f"http://127.0.0.1:{workspace.port}/v1/chat/completions"
        self.key = key
        self.answers: list[tuple[int, str]] = []
        self._threads: list[threading.Thread] = []

    def ask(self) -> None:
        def call() -> None:
            body = json.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}]})
            request = urllib.request.Request(self.url, body.encode(),
                                             {"Authorization": f"Bearer {self.key}"})  # fmt: skip
            with urllib.request.urlopen(request, timeout=20) as answer:
                content = json.loads(answer.read())["choices"][0]["message"]["content"]
                self.answers.append((answer.status, content))

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        self._threads.append(thread)

    def wait(self, timeout_s: float = 20.0) -> list[tuple[int, str]]:
        for thread in self._threads:
            thread.join(timeout_s)
        return self.answers


class Stalled:
    """A driver's fence that, once armed, stalls its first caller until released: the driver's
    process stopped (a VM paused, SIGSTOP) right after its reader handed it the request."""

    def __init__(self, lease: driver_lease.Lease) -> None:
        self.lease = lease
        self.armed, self.entered, self.released = False, threading.Event(), threading.Event()

    def __call__(self) -> None:
        if self.armed and not self.entered.is_set():
            self.entered.set()
            assert self.released.wait(20)
        self.lease.fence()


def _take_over(ctx: Context, attempt_id: int, holder: str) -> driver_lease.Lease:
    """`holder` takes the attempt over once the first driver's lease has expired (its clock
    moved past the TTL instead of this test waiting for it)."""
    later = utcnow() + timedelta(seconds=driver_lease.LEASE_TTL_S + 1)
    driver_lease.acquire(ctx, attempt_id, holder, now=later)
    return driver_lease.Lease(ctx, attempt_id, holder)


def _model_calls(ctx: Context) -> int:
    with ctx.session() as session:
        return int(session.scalar(select(func.count()).select_from(ModelCall)) or 0)


def test_a_driver_that_lost_its_lease_but_lives_neither_calls_the_model_nor_answers(
    ctx: Context, model: FakeOpenAI, workspace: DirectoryWorkspace
) -> None:
    """Driver A's reader hands it the agent's request, then A stalls past its lease; B takes the
    attempt over and its reader hands the still waiting request on to B, which answers it. A
    resumes: before, it called the model too (paid twice) and wrote a second answer, and its
    stop killed B's reader. Now A finds it lost the lease, leaves the request, and stops only
    what is its own."""
    proxy, key = _passthrough(ctx, model)
    lease_a = driver_lease.Lease(ctx, proxy.attempt_id, driver_lease.holder_name("driver A"))
    driver_lease.acquire(ctx, proxy.attempt_id, lease_a.holder)
    stall = Stalled(lease_a)
    a = RelayChannel(workspace, HANDLE, proxy.handle, fence=stall)  # type: ignore[arg-type]
    a.start()
    stall.armed = True
    agent = Agent(workspace, key)
    agent.ask()
    assert stall.entered.wait(20), "the request never reached driver A"

    lease_b = _take_over(ctx, proxy.attempt_id, driver_lease.holder_name("driver B"))
    b = RelayChannel(workspace, HANDLE, proxy.handle, fence=lease_b.fence)  # type: ignore[arg-type]
    b.start()
    try:
        assert agent.wait() == [(200, "the one answer")]
        stall.released.set()  # A resumes
        a.pool.shutdown(wait=True)
        assert lease_a.lost
        assert model.calls == 1 and _model_calls(ctx) == 1
        assert sorted(p.name for p in (workspace.relay / "out").iterdir()) == []  # no 2nd answer
        a.stop(server=False)  # A's driver ends: B's reader goes on
        again = Agent(workspace, key)
        again.ask()
        assert again.wait() == [(200, "the one answer")]
        assert model.calls == 2
    finally:
        stall.released.set()
        b.stop()


def test_a_dead_drivers_request_is_answered_once_by_the_driver_that_takes_its_lease_over(
    ctx: Context, model: FakeOpenAI, workspace: DirectoryWorkspace
) -> None:
    """Driver A died with the agent's request taken and another one answered but not collected
    yet. While A's lease holds, no other driver takes the attempt; once it has expired, B does:
    B's reader hands it the waiting request, not the answered one, and B answers it once."""
    proxy, key = _passthrough(ctx, model)
    lease_a = driver_lease.Lease(ctx, proxy.attempt_id, driver_lease.holder_name("driver A"))
    driver_lease.acquire(ctx, proxy.attempt_id, lease_a.holder)
    dead = Stalled(lease_a)  # never released while B drives: A is gone
    a = RelayChannel(workspace, HANDLE, proxy.handle, fence=dead)  # type: ignore[arg-type]
    a.start()
    # A request A answered just before it died, whose connection has not collected the answer.
    body = base64.b64encode(b'{"messages": [{"role": "user", "content": "before"}]}').decode()
    relay = workspace.relay
    (relay / "in" / "answered.json").write_text(json.dumps({
        "id": "answered", "method": "POST", "path": "/v1/chat/completions",
        "headers": {"authorization": f"Bearer {key}"}, "body": body,
    }))  # fmt: skip
    (relay / "out" / "answered.json").write_text(
        json.dumps({"status": 200, "content_type": "application/json", "body": ""})
    )
    (relay / "out" / "answered.done").write_text("")
    dead.armed = True
    agent = Agent(workspace, key)
    agent.ask()
    assert dead.entered.wait(20), "the request never reached driver A"
    with pytest.raises(driver_lease.DriverBusy, match="driven by driver A"):
        driver_lease.hold(ctx, proxy.attempt_id, "driver B")

    lease_b = _take_over(ctx, proxy.attempt_id, driver_lease.holder_name("driver B"))
    b = RelayChannel(workspace, HANDLE, proxy.handle, fence=lease_b.fence)  # type: ignore[arg-type]
    b.start()
    try:
        assert agent.wait() == [(200, "the one answer")]
        assert model.calls == 1 and _model_calls(ctx) == 1
    finally:
        dead.released.set()
        a.pool.shutdown(wait=True)
        b.stop()
    assert model.calls == 1


class Untouchable:
    """The workspace of a driver that must not touch it: any use fails the test."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"a driver that lost the attempt used its workspace ({name})")

    def close(self) -> None:
        """Its connection to the engine closes (a driver closes its backend when it ends)."""


def test_a_driver_that_lost_the_attempt_before_its_relay_starts_touches_nothing(
    ctx: Context, model: FakeOpenAI
) -> None:
    """The driver's fence is the lease's database check, wired through `run_agent` and the
    command agent into its relay: a driver whose lease another took over while it was getting
    ready stops before its reader (which would stop the new driver's) starts, and leaves the run
    and the attempt as they are, for the new driver."""
    attempt_id = make_attempt(ctx)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        participant = attempt.participant
        participant.agent_scaffold, participant.agent_endpoint = "command", model.base_url
        participant.agent_limits = {**PRICES, "command": "my-agent", "command_version": "1"}
        attempt.status, attempt.started_at = AttemptStatus.RUNNING, utcnow()
        host = Host(name=f"h{attempt_id}", docker_url="unix:///nowhere.sock", healthy=True)
        session.add(host)
        session.flush()
        session.add(Workspace(attempt_id=attempt_id, purpose=WorkspacePurpose.ATTEMPT,
                              host_id=host.id, backend="docker", name=f"ws-a{attempt_id}",
                              image="img", hardware_profile="cpu",
                              status=WorkspaceStatus.RUNNING))  # fmt: skip

    def taken_over_meanwhile(host: Host) -> Untouchable:
        _take_over(ctx, attempt_id, "agent run B")
        return Untouchable()

    with pytest.raises(driver_lease.DriverLost, match="taken over"):
        agent_worker.run_agent(
            ctx, attempt_id, "agent worker", backend_factory=taken_over_meanwhile
        )
    with ctx.session() as session:
        run = session.scalar(select(AgentRun).where(AgentRun.attempt_id == attempt_id))
        attempt = session.get(Attempt, attempt_id)
        assert run is not None and attempt is not None
        assert (run.status, attempt.status) == (AgentRunStatus.RUNNING, AttemptStatus.RUNNING)
    with pytest.raises(driver_lease.DriverBusy, match="driven by agent run B"):
        driver_lease.acquire(ctx, attempt_id, "agent run C")
    assert model.calls == 0


def test_a_driver_whose_reader_restarts_does_not_ask_the_model_twice(
    ctx: Context, model: FakeOpenAI, workspace: DirectoryWorkspace
) -> None:
    """The driver restarts its reader (the last one's exec ended) while it answers a request:
    the new reader hands that request on again, still waiting, and the driver lets it be."""
    proxy, key = _passthrough(ctx, model)
    first, release = threading.Event(), threading.Event()

    def slow_first(request: ProxyRequest) -> ProxyResponse:
        if not first.is_set():
            first.set()
            assert release.wait(20)
        return proxy.handle(request)

    channel = RelayChannel(workspace, HANDLE, slow_first)  # type: ignore[arg-type]
    channel.start()
    try:
        agent = Agent(workspace, key)
        agent.ask()
        assert first.wait(20), "the request never reached the driver"
        channel.start()  # hands the first request on again
        later = Agent(workspace, key)
        later.ask()  # its frame follows the first one's on the new reader's stream
        assert later.wait() == [(200, "the one answer")]
        release.set()
        assert agent.wait() == [(200, "the one answer")]
        channel.pool.shutdown(wait=True)
        assert model.calls == 2
    finally:
        release.set()
        channel.stop()
