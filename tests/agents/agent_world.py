"""Agent attempts on the real Docker Engine, driven by the scripted fake model.

`agent_attempt` makes a study with the bundled demo paper task, enrols an agent configuration
(its endpoint the fake server) and launches its attempt into a real workspace; `Script` answers
the model's requests from a list of replies, in order, and keeps every request it saw.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import select

from baseline.attempts import launch
from baseline.context import Context
from baseline.models import Attempt, AttemptStatus, Host, TranscriptEntry
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import workspaces
from infra.docker_backend import DockerBackend
from infra.workspace import WorkspaceBackend
from tests.docker_env import LOCAL_URL, TEST_LABELS, docker_url
from tests.fake_openai import Reply, ToolCall

PRICES = {"input_usd_per_mtok": 2.0, "output_usd_per_mtok": 8.0}
AGENT_MODEL = "fake-agent"


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)


@pytest.fixture
def cleanup(ctx: Context) -> Iterator[None]:
    docker_url("unix")
    yield
    with ctx.session() as session:
        for workspace in workspaces.live_workspaces(session):
            workspaces.destroy(session, workspace, factory)


def call(name: str, **arguments: Any) -> Reply:
    return Reply(tool_calls=(ToolCall(name, arguments),))


def bash(cmd: str) -> Reply:
    return call("bash", cmd=cmd)


Step = Reply | Callable[[dict[str, Any]], Reply]


@dataclass
class Script:
    """Answers the n-th answered request with the n-th step; the last step repeats."""

    steps: Sequence[Step]
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            index = min(len(self.bodies), len(self.steps) - 1)
            self.bodies.append(body)
        step = self.steps[index]
        return step(body) if callable(step) else step


@dataclass
class AgentWorld:
    study_id: int
    attempt_id: int
    task_id: int


def agent_attempt(
    ctx: Context,
    image: str,
    base_url: str,
    *,
    scaffold: str = "basic",
    settings: dict[str, Any] | None = None,
    time_scale: float = 3600.0,
    limit_hours: float = 48.0,
    checkpoints: tuple[float, ...] = (2, 8, 32, 48),
    name: str = "agents study",
) -> AgentWorld:
    """A launched, running agent attempt on the local engine."""
    docker_url("unix")
    with ctx.session() as session:
        if session.scalar(select(Host).where(Host.name == "local")) is None:
            host = workspaces.add_host(session, "local", LOCAL_URL, None)
            assert workspaces.check_host(session, host).healthy
        study = studies.create_study(
            session,
            studies.StudySpec(
                name=name,
                egress_policy="none",
                time_scale=time_scale,
                working_time_limit_hours=limit_hours,
                checkpoint_hours=list(checkpoints),
                reproduction_timeout_minutes=5,
            ),
            None,
        )
        paper = next(t for t in tasks.import_demo_tasks(session, ctx.settings)
                     if t.slug == "digits-baselines")  # fmt: skip
        studies.add_task(session, study, paper, None)
        session.flush()
        session.refresh(study)
        agent = studies.add_agent(
            session, study, f"{scaffold} agent", scaffold, AGENT_MODEL, base_url,
            {**PRICES, "backoff_initial_s": 0.05, "backoff_max_s": 0.2, **(settings or {})},
            None,
        )  # fmt: skip
        attempt_id = studies.create_attempt(session, agent, paper, None).id
        world = AgentWorld(study.id, attempt_id, paper.id)
    status = launch.launch(ctx, attempt_id, None, image=image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING
    return world


def entries(ctx: Context, attempt_id: int) -> list[TranscriptEntry]:
    from baseline.runs.transcripts import run_of

    with ctx.session() as session:
        run = run_of(session, attempt_id)
        assert run is not None
        rows = list(run.entries)
        for row in rows:
            session.expunge(row)
        return rows


def attempt(ctx: Context, attempt_id: int) -> Attempt:
    with ctx.session() as session:
        found = session.get(Attempt, attempt_id)
        assert found is not None
        found.pauses, found.snapshots  # noqa: B018 - load before detaching
        session.expunge_all()
        return found
