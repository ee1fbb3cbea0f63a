"""The agent worker drives every launched agent attempt at once, and only those."""

from __future__ import annotations

from typing import Any

import pytest

from baseline.context import Context
from baseline.models import AgentRunStatus, AttemptStatus
from baseline.runs.agent_worker import Worker, runnable_attempts
from baseline.runs.transcripts import run_of
from tests.agents.agent_world import agent_attempt, attempt, bash, call, cleanup, factory
from tests.docker_env import test_image
from tests.fake_openai import FakeOpenAI, Reply

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["cleanup", "test_image"]


def per_conversation(body: dict[str, Any]) -> Reply:
    """Two steps in each agent's own conversation, then the end."""
    done = sum(1 for m in body["messages"] if m["role"] == "assistant")
    return bash(f"echo {done} >> steps.log") if done < 2 else call("end_task")


def test_the_worker_drives_launched_agent_attempts_concurrently(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    with FakeOpenAI(answer=per_conversation) as server:
        first = agent_attempt(ctx, test_image, server.base_url, name="one")
        second = agent_attempt(ctx, test_image, server.base_url, name="two")
        assert runnable_attempts(ctx) == [first.attempt_id, second.attempt_id]
        worker = Worker(ctx, backend_factory=factory)
        assert sorted(worker.poll()) == [first.attempt_id, second.attempt_id]
        assert worker.poll() == []  # already driven
        worker.join()
    assert worker.errors == {}
    for world in (first, second):
        assert attempt(ctx, world.attempt_id).status is AttemptStatus.SUBMITTED
        with ctx.session() as session:
            run = run_of(session, world.attempt_id)
            assert run is not None and run.status is AgentRunStatus.FINISHED and run.steps == 3
    assert runnable_attempts(ctx) == []
