"""Acceptance (issue 11): an API agent completes an attempt with its agent token, in a real Docker
workspace; a token of another attempt, a user's token and a revoked token are refused.

The agent is a test client: it reads its clock, lists and reads the task, writes code and a
reproduce.sh, runs it, and submits. Every call lands in the audit trail and in the attempt's
transcript, as a built-in agent's tool calls do.
"""

from __future__ import annotations

from typing import Any

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select

from baseline.context import Context
from baseline.models import (
    AgentRunStatus,
    Attempt,
    AttemptStatus,
    AttemptToken,
    AuditEvent,
    Role,
    Snapshot,
    SnapshotKind,
)
from baseline.people import accounts
from baseline.runs.agent_worker import running_attempts
from baseline.runs.transcripts import run_of
from tests.agents.agent_world import agent_attempt, cleanup, entries
from tests.conftest import Users, json_of
from tests.docker_env import test_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["cleanup", "test_image"]

UNUSED_ENDPOINT = "http://127.0.0.1:9/v1"  # an API agent brings its own model: never called


def _token(client: FlaskClient, admin_token: str, attempt_id: int) -> str:
    answer = client.post(
        f"/api/v1/attempts/{attempt_id}/agent-token",
        headers={"Authorization": f"Bearer {admin_token}"},
    )
    assert answer.status_code == 201, answer.json
    token: str = json_of(answer)["token"]
    return token


@pytest.mark.sqlite_only(
    "the workspace API's calls; the documented path's test runs on both databases"
)
def test_api_agent_completes_an_attempt(
    ctx: Context, app: Any, users: Users, test_image: str, cleanup: None
) -> None:
    # Real time (time_scale 1): the first checkpoint stays ahead however slow the machine is.
    mine = agent_attempt(
        ctx, test_image, UNUSED_ENDPOINT, scaffold="api", name="api study", time_scale=1.0
    )
    other = agent_attempt(
        ctx, test_image, UNUSED_ENDPOINT, scaffold="api", name="other study", time_scale=1.0
    )
    with ctx.session() as session:
        admin_token = accounts.issue_token(session, session.merge(users[Role.ADMIN]), "t")
    client = app.test_client()
    token = _token(client, admin_token, mine.attempt_id)
    other_token = _token(client, admin_token, other.attempt_id)
    auth = {"Authorization": f"Bearer {token}"}
    base = f"/api/v1/attempts/{mine.attempt_id}/workspace"

    # Refusals: another attempt's token, a user's token, no token, an unknown token.
    foreign = client.get(f"{base}/task", headers={"Authorization": f"Bearer {other_token}"})
    assert foreign.status_code == 403 and "another attempt" in foreign.json["message"]
    user_token = client.get(f"{base}/task", headers={"Authorization": f"Bearer {admin_token}"})
    assert user_token.status_code == 403
    assert client.get(f"{base}/task").status_code == 401
    unknown = client.get(f"{base}/task", headers={"Authorization": "Bearer bat_nope"})
    assert unknown.status_code == 401
    # The token opens no other route.
    assert client.get(f"/api/v1/attempts/{mine.attempt_id}", headers=auth).status_code == 401

    status = client.get(f"{base}/task", headers=auth).json
    assert status["status"] == "running" and status["remaining_s"] > 0
    assert status["next_checkpoint_working_s"] == 2 * 3600.0 and status["can_pause"] is False

    listed = client.get(f"{base}/list", query_string={"path": "/home/paper"}, headers=auth)
    assert "paper.md" in {e["name"] for e in listed.json["entries"]}
    paper = client.get(f"{base}/file", query_string={"path": "/home/paper/paper.md"}, headers=auth)
    assert paper.status_code == 200 and paper.json["encoding"] == "utf-8" and paper.json["size"] > 0
    missing = client.get(f"{base}/file", query_string={"path": "/home/nope.txt"}, headers=auth)
    assert missing.status_code == 404 and "no such file" in missing.json["message"]
    shadow = client.get(f"{base}/file", query_string={"path": "/etc/shadow"}, headers=auth)
    assert shadow.status_code == 403 and "permission denied" in shadow.json["message"]

    code = (
        'import json, os\nos.makedirs("results", exist_ok=True)\n'
        'json.dump({"ok": 1}, open("results/m.json", "w"))\n'
    )
    files = {"solve.py": code, "reproduce.sh": "#!/bin/bash\npython3 solve.py\n"}
    for name, text in files.items():
        path = f"/home/submission/{name}"
        wrote = client.put(f"{base}/file", json={"path": path, "content": text}, headers=auth)
        assert wrote.status_code == 200 and wrote.json["bytes"] == len(text)
    command = "bash reproduce.sh && id -un && cat results/m.json"
    ran = client.post(f"{base}/exec", json={"command": command}, headers=auth)
    assert ran.status_code == 200, ran.json
    assert ran.json["exit_code"] == 0 and "participant" in ran.json["output"]
    assert '{"ok": 1}' in ran.json["output"]
    # The paper is read-only for the agent, as for a human.
    denied = client.put(
        f"{base}/file", json={"path": "/home/paper/x", "content": "x"}, headers=auth
    )
    assert denied.status_code == 409
    # Output cap and time-out come from the shared tool path.
    slow = client.post(f"{base}/exec", json={"command": "sleep 30", "timeout_s": 1}, headers=auth)
    assert slow.json["timed_out"] is True and slow.json["exit_code"] is None

    submitted = client.post(f"{base}/submit", headers=auth)
    assert submitted.status_code == 200, submitted.json
    assert running_attempts(ctx) == []  # the API agent's run is not the worker's to resume
    with ctx.session() as session:
        attempt = session.get(Attempt, mine.attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.SUBMITTED
        final = session.get(Snapshot, submitted.json["snapshot_id"])
        assert final is not None and final.kind is SnapshotKind.FINAL
        tokens = session.scalars(
            select(AttemptToken).where(AttemptToken.attempt_id == mine.attempt_id)
        ).all()
        assert tokens and all(t.revoked_at is not None for t in tokens)
        actions = set(
            session.scalars(
                select(AuditEvent.action).where(AuditEvent.target_id == str(mine.attempt_id))
            )
        )
    assert {"attempt.workspace.exec", "attempt.workspace.write_file", "attempt.workspace.submit",
            "attempt.workspace.status", "attempt_token.revoke"} <= actions  # fmt: skip
    # Ended: the token is dead.
    assert client.get(f"{base}/task", headers=auth).status_code == 401

    # The transcript has each workspace call as a tool call and its result.
    with ctx.session() as session:
        run = run_of(session, mine.attempt_id)
        assert run is not None and run.status is AgentRunStatus.FINISHED and run.scaffold == "api"
    rows = entries(ctx, mine.attempt_id)
    starts = [r for r in rows if r.kind == "tool_start"]
    results = [r for r in rows if r.role == "tool"]
    assert [r.tool_name for r in starts] == [r.tool_name for r in results]
    assert "exec" in {r.tool_name for r in starts}
    ran_row = next(r for r in results if r.tool_name == "exec" and r.exit_code == 0)
    assert "participant" in (ran_row.content or "")
    assert any(r.timed_out for r in results)
