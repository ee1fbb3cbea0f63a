"""Acceptance: a command agent completes an attempt in a real Docker workspace.

The agent is a small script standing in for an external agent program: run by the worker
inside the workspace (no network: the study has no internet), it calls the fake OpenAI server
through the attempt's passthrough with the per-attempt key it was given, writes a reproduce.sh
from the answer, commits and exits; the attempt is then submitted. The provider's key reaches the
provider and appears nowhere in the workspace; a forged key is refused.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from baseline.context import Context
from baseline.models import (
    AgentRunStatus,
    AttemptStatus,
    Host,
    ModelCall,
    Workspace,
    WorkspaceStatus,
)
from baseline.runs import agent_worker
from infra.docker_backend import DockerBackend
from infra.workspace import WorkspaceBackend, WorkspaceHandle
from tests.agents.agent_world import agent_attempt, attempt, cleanup, entries, factory
from tests.docker_env import TEST_LABELS, test_image
from tests.fake_openai import FakeOpenAI

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["cleanup", "test_image"]

PROVIDER_KEY = "sk-provider-secret-c11-e2e"
REPRODUCE = "#!/usr/bin/env bash\necho reproduced\n"
AGENT = r"""
import json, os, subprocess, urllib.error, urllib.request
base = os.environ["OPENAI_BASE_URL"]
def ask(text, key):
    body = {"model": "whatever", "messages": [{"role": "user", "content": text}]}
    request = urllib.request.Request(base + "/chat/completions", json.dumps(body).encode(),
        {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)
json.dump(dict(os.environ), open("/home/logs/agent-env.json", "w"))
try:
    ask("hello", "bl-model-forged")
except urllib.error.HTTPError as exc:
    print("forged key:", exc.code, json.load(exc)["error"]["code"])
answer = ask("write reproduce.sh", os.environ["OPENAI_API_KEY"])
open("reproduce.sh", "w").write(answer["choices"][0]["message"]["content"])
subprocess.run(["git", "add", "reproduce.sh"], check=True)
subprocess.run(["git", "commit", "-qm", "agent: reproduce.sh"], check=True)
print("agent", os.environ["AGENT_MODE"], "done")
"""


# What the checks below read in the workspace once the command has exited; the provider key is
# looked for everywhere: in every process's environment and command line, in every file.
PATTERN = f"{PROVIDER_KEY[:-1]}[{PROVIDER_KEY[-1]}]"  # never matches the grep itself
LOOKS = {
    "log": "cat /home/logs/agent.log",
    "env": "cat /home/logs/agent-env.json",
    "found": f"grep -rls '{PATTERN}' /proc/[0-9]*/environ /proc/[0-9]*/cmdline "
    "/home /opt /tmp /etc /run /root /var 2>/dev/null; true",
    "control": "grep -rls 'bl-model[-]' /home/logs 2>/dev/null; true",  # the same search
    "reproduce": "cat /home/submission/reproduce.sh",
}


class LookingFirst(DockerBackend):
    """The tests' backend, which runs `LOOKS` in a workspace before stopping it: the attempt's
    end stops it, and /home/logs and the processes go with the running container."""

    seen: dict[str, str]

    def stop(self, handle: WorkspaceHandle) -> None:
        for key, script in LOOKS.items():
            result = self.exec(handle, ["sh", "-c", script], user="root", timeout_s=60)
            self.seen[key] = result.output.decode()
        self.seen["container"] = json.dumps(self.client.containers.get(handle.name).attrs)
        super().stop(handle)


@pytest.mark.sqlite_only(
    "the relay and passthrough; the restarted worker's test runs on both databases"
)
def test_a_command_agent_completes_an_attempt_through_the_passthrough(
    ctx: Context, test_image: str, cleanup: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, str] = {}

    def looking(host: Host) -> WorkspaceBackend:
        backend = LookingFirst.from_url(host.docker_url, labels=TEST_LABELS)
        assert isinstance(backend, LookingFirst)
        backend.seen = seen
        return backend

    monkeypatch.setenv("OPENAI_API_KEY", PROVIDER_KEY)  # the worker's, i.e. the provider's key
    with FakeOpenAI(answer=lambda body: REPRODUCE) as fake:
        settings = {"command": 'python3 -c "$AGENT_SRC"', "command_version": "stand-in 1.0",
                    "command_env": {"AGENT_SRC": AGENT, "AGENT_MODE": "e2e"}}  # fmt: skip
        world = agent_attempt(ctx, test_image, fake.base_url, scaffold="command",
                              settings=settings)  # fmt: skip
        worker = agent_worker.Worker(ctx, backend_factory=looking)
        assert worker.poll() == [world.attempt_id]
        worker.join()
        assert worker.errors == {}
        assert fake.authorizations == [f"Bearer {PROVIDER_KEY}"]  # the forged call never left

        with ctx.session() as session:
            workspace = session.scalar(
                select(Workspace).where(Workspace.attempt_id == world.attempt_id)
            )
            assert workspace is not None and workspace.status is WorkspaceStatus.STOPPED
            calls = session.scalars(select(ModelCall)).all()

        log = seen["log"]
        assert "forged key: 401 invalid_api_key" in log and "agent e2e done" in log, log
        env = json.loads(seen["env"])
        assert env["OPENAI_API_KEY"].startswith("bl-model-")
        assert env["OPENAI_BASE_URL"].startswith("http://127.0.0.1:")
        # The provider key is nowhere in the workspace: not in any process's environment or
        # command line, not in a file, not in the container's configuration.
        assert seen["found"].strip() == ""
        assert "/home/logs/agent-env.json" in seen["control"]  # finds the key the agent does hold
        assert PROVIDER_KEY not in seen["container"]
        assert seen["reproduce"] == REPRODUCE

    done = attempt(ctx, world.attempt_id)
    assert done.status is AttemptStatus.SUBMITTED, done.end_reason
    steps = entries(ctx, world.attempt_id)
    assert [e.kind for e in steps if e.kind == "model_call"] == ["model_call"]
    assert any("stand-in 1.0" in (e.content or "") for e in steps if e.kind == "notice")
    assert len(calls) == 1 and calls[0].prompt_tokens > 0 and calls[0].cost_usd > 0
    with ctx.session() as session:
        from baseline.runs.transcripts import run_of

        run = run_of(session, world.attempt_id)
        assert run is not None and run.status is AgentRunStatus.FINISHED
        assert run.scaffold == "command" and run.end_reason == "the command exited (0)"
        assert run.settings["command_version"] == "stand-in 1.0"
        assert run.settings["command_env"]["AGENT_MODE"] == "e2e"
        assert run.prompt_tokens == calls[0].prompt_tokens


GREEDY = r"""
import json, os, time, urllib.error, urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "more " * 50}]})
while True:
    request = urllib.request.Request(base + "/chat/completions", body.encode(),
        {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=60).read()
    except urllib.error.HTTPError as exc:
        print("refused:", exc.code, json.load(exc)["error"]["type"], flush=True)
        break
time.sleep(3600)  # a stubborn agent: it is stopped when the attempt ends
"""


def test_a_command_agent_past_its_token_limit_is_refused_and_its_attempt_ends(
    ctx: Context, test_image: str, cleanup: None
) -> None:
    with FakeOpenAI(answer=lambda body: "fine") as fake:
        settings = {"command": 'python3 -c "$AGENT_SRC"', "command_version": "greedy 1",
                    "command_env": {"AGENT_SRC": GREEDY}, "token_limit": 150}  # fmt: skip
        world = agent_attempt(ctx, test_image, fake.base_url, scaffold="command",
                              settings=settings)  # fmt: skip
        # `baseline agent run` (run_agent) drives command agents too.
        outcome = agent_worker.run_agent(ctx, world.attempt_id, backend_factory=factory)
        assert outcome.status is AgentRunStatus.FINISHED
        answered = fake.calls
    done = attempt(ctx, world.attempt_id)
    assert done.status is AttemptStatus.ENDED
    assert done.end_reason is not None and "token limit" in done.end_reason
    with ctx.session() as session:
        from baseline.models import ModelKey
        from baseline.runs.transcripts import run_of

        run = run_of(session, world.attempt_id)
        assert run is not None and run.status is AgentRunStatus.FINISHED
        tokens = run.prompt_tokens + run.completion_tokens
        assert tokens >= 150 and answered == run.steps >= 1
        # Every call before the limit was answered; none after it reached the provider.
        assert tokens - (run.prompt_tokens + run.completion_tokens) // run.steps < 150
        keys = session.scalars(select(ModelKey).where(ModelKey.attempt_id == world.attempt_id))
        assert all(k.revoked_at is not None for k in keys)


PATIENT = r"""
import json, os, time, urllib.request
time.sleep(6)  # long enough for the worker to die and come back meanwhile
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(),
    {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
print(urllib.request.urlopen(request, timeout=60).status, flush=True)
"""


class WorkerDied(BaseException):
    """Stands in for the worker process dying: nothing in the run catches it."""


def _die(_seconds: float) -> None:
    raise WorkerDied


def test_a_restarted_worker_resumes_a_command_agent_without_restarting_it(
    ctx: Context, test_image: str, cleanup: None
) -> None:
    from baseline.runs.command_agents import CommandAgent

    with FakeOpenAI(answer=lambda body: "ok") as fake:
        settings = {"command": 'python3 -c "$AGENT_SRC"', "command_version": "patient 1",
                    "command_env": {"AGENT_SRC": PATIENT}}  # fmt: skip
        world = agent_attempt(ctx, test_image, fake.base_url, scaffold="command",
                              settings=settings)  # fmt: skip
        with pytest.raises(WorkerDied):  # dies at its first wait, the command running
            CommandAgent(ctx, world.attempt_id, backend_factory=factory, sleep=_die).run()
        outcome = CommandAgent(ctx, world.attempt_id, backend_factory=factory, poll_s=0.5).run()
        assert outcome.end_reason == "the command exited (0)"
        assert fake.calls == 1
    notices = [e.content or "" for e in entries(ctx, world.attempt_id) if e.kind == "notice"]
    assert sum(n.startswith("started:") for n in notices) == 1  # never started twice
    assert "resumed after a worker restart; the command is running" in notices
    assert attempt(ctx, world.attempt_id).status is AttemptStatus.SUBMITTED
