"""An agent of a blacklist study reaches out from its first step (issue 36 item 6), driven the way
the README says: `baseline attempt launch ID && baseline agent run ID`.

The launch routes the workspace through the egress proxy, which is the launching process's child:
when that command ends, the proxy ends with it. The driver's first requests then failed to
connect (no egress evidence) until a portal's egress job, if one ran, brought the proxy back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from baseline.attempts import launch
from baseline.context import Context
from baseline.models import Attempt, AttemptStatus
from baseline.runs.agent_worker import run_agent
from baseline.workspaces.egress_gateway import EgressGateway
from tests.agents.agent_world import PRICES, Script, bash, call, entries
from tests.baseline.egress_world import CLIENT, Server, blacklist_attempt, factory, gateway, server
from tests.docker_env import LOCAL_URL, test_image
from tests.fake_openai import FakeOpenAI

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["gateway", "server", "test_image"]


@pytest.mark.sqlite_only("the egress proxy's lifetime across processes")
def test_the_driver_brings_the_proxy_back_before_the_first_step(
    ctx: Context, gateway: EgressGateway, server: Server, test_image: str, tmp_path: Path
) -> None:
    allowed = f"{server.base}/open/data.csv"
    attempt_id = blacklist_attempt(ctx, tmp_path, f"{server.base}/blocked\n", LOCAL_URL)
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING
    gateway.stop()  # `baseline attempt launch` exits, and its proxy with it

    script = Script([bash(f"python3 -c '{CLIENT}' {allowed}"), call("end_task")])
    with FakeOpenAI(answer=script) as model:
        with ctx.session() as session:  # the enrolled agent, its endpoint the fake model
            agent = session.get(Attempt, attempt_id)
            assert agent is not None
            agent.participant.agent_endpoint = model.base_url
            agent.participant.agent_limits = PRICES
        outcome = run_agent(ctx, attempt_id, backend_factory=factory)
    assert outcome.end_reason == "the agent ended the task"
    replies = [e.content or "" for e in entries(ctx, attempt_id) if e.role == "tool"]
    assert f"200 {allowed}" in replies[0], replies[0]
    assert server.seen == ["/open/data.csv"]
