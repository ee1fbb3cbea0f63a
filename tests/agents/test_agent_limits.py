"""Per-attempt agent settings on the real Docker Engine: token and cost limits end the attempt,
generation time that does not count is paused, and a large tool output is kept as a blob while
the agent is shown a capped view."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from baseline.attempts import attempts, clock, schedule
from baseline.attempts.snapshots import store_for
from baseline.context import Context
from baseline.models import (
    AgentRunStatus,
    Attempt,
    AttemptStatus,
    PauseReason,
    Snapshot,
    SnapshotKind,
)
from baseline.runs.agent_runs import AgentLoop
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
from tests.docker_env import test_image
from tests.fake_openai import FakeOpenAI

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["cleanup", "test_image"]


@pytest.mark.parametrize(
    ("setting", "reason"),
    [({"token_limit": 400}, "token limit reached"), ({"cost_limit_usd": 0.002}, "cost limit")],
)
def test_a_token_or_cost_limit_ends_the_attempt(
    ctx: Context, cleanup: None, test_image: str, setting: dict[str, float], reason: str
) -> None:
    script = Script([bash("echo working; printf 'y%.0s' $(seq 1 400)")])  # never ends by itself
    with FakeOpenAI(answer=script) as server:
        world = agent_attempt(ctx, test_image, server.base_url, settings=setting)
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
    assert outcome.status is AgentRunStatus.FINISHED
    assert outcome.end_reason is not None and outcome.end_reason.startswith(reason)
    assert 1 < outcome.steps < 20
    done = attempt(ctx, world.attempt_id)
    assert done.status is AttemptStatus.ENDED and done.end_reason == outcome.end_reason
    assert SnapshotKind.FINAL in {s.kind for s in done.snapshots}


def test_generation_time_that_does_not_count_is_paused_call_by_call(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    script = Script([bash("echo one"), bash("echo two"), bash("true"), call("end_task")])
    with FakeOpenAI(answer=script, latency_s=0.3) as server:
        world = agent_attempt(
            ctx, test_image, server.base_url, settings={"generation_counts": False}
        )
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
    assert outcome.status is AgentRunStatus.FINISHED and outcome.steps == 4
    done = attempt(ctx, world.attempt_id)
    pauses = [p for p in done.pauses if p.reason is PauseReason.GENERATION]
    assistants = [e for e in entries(ctx, world.attempt_id) if e.role == "assistant"]
    assert len(pauses) == len(assistants) == 4
    for pause, step in zip(pauses, assistants, strict=True):
        assert pause.ended_at == step.ended_at  # each call's generation, paused
        assert pause.started_at <= step.started_at
        assert (pause.ended_at - pause.started_at).total_seconds() >= 0.3
    assert clock.state(done).paused_wall_s >= 4 * 0.3


def test_a_large_output_is_kept_whole_as_a_blob_and_shown_capped(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    script = Script([bash("printf 'z%.0s' $(seq 1 20000)"), call("end_task")])
    with FakeOpenAI(answer=script) as server:
        world = agent_attempt(ctx, test_image, server.base_url,
                              settings={"shown_output_bytes": 1000})  # fmt: skip
        AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
    reply = next(e for e in entries(ctx, world.attempt_id) if e.role == "tool")
    assert reply.output_bytes == 20000 and reply.output_sha256 is not None
    assert store_for(ctx).get_bytes(reply.output_sha256) == b"z" * 20000
    assert "[output truncated: first 1000 bytes shown]" in (reply.content or "")
    assert len(reply.content or "") < 1200
    told = script.bodies[1]["messages"][-1]["content"]
    assert told == reply.content


def test_an_attempt_that_ends_while_the_agent_submits_ends_the_run_without_an_error(
    ctx: Context, cleanup: None, test_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The working-time limit falls due while the agent's `end_task` runs (seen in the live
    demo at its time-scaled clock): the scheduler's final snapshot ends the attempt first, and
    the agent's submission then finds it ended. The run ends with the attempt, no traceback."""
    real_submit = attempts.submit

    def limit_first(
        ctx_: Context,
        attempt_id: int,
        actor_id: int | None,
        resolver: Any,
        now: datetime | None = None,
        backend_factory: Any = factory,
    ) -> Snapshot:
        with ctx_.session() as session:
            source = resolver(session, session.get(Attempt, attempt_id))
        schedule.finish(
            ctx_, attempt_id, AttemptStatus.ENDED, "working-time limit", None, source, None,
            backend_factory=backend_factory,
        )  # fmt: skip
        return real_submit(ctx_, attempt_id, actor_id, resolver, now, backend_factory)

    monkeypatch.setattr(attempts, "submit", limit_first)
    script = Script([bash("echo almost done"), call("end_task", message="done")])
    with FakeOpenAI(answer=script) as server:
        world = agent_attempt(ctx, test_image, server.base_url)
        outcome = AgentLoop(ctx, world.attempt_id, backend_factory=factory).run()
    assert outcome.status is AgentRunStatus.FINISHED
    assert outcome.end_reason == "attempt ended before the agent's submission"
    done = attempt(ctx, world.attempt_id)
    assert done.status is AttemptStatus.ENDED and done.end_reason == "working-time limit"
    assert [s.kind for s in done.snapshots].count(SnapshotKind.FINAL) == 1
