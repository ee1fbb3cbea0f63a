"""The agent transcript page and its JSON-lines export: coordinators see every step on the
attempt's timeline; graders, analysts and participants are refused (blinding)."""

from __future__ import annotations

import json
from datetime import timedelta

from flask.testing import FlaskClient

from baseline.context import Context
from baseline.models import (
    AgentRun,
    AttemptStatus,
    BlacklistHit,
    Role,
    Snapshot,
    SnapshotKind,
    Task,
    TaskKind,
    TranscriptEntry,
    utcnow,
)
from baseline.studies import studies
from tests.conftest import Users, login


def _agent_attempt_with_transcript(ctx: Context) -> int:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Transcript study"), None)
        task = Task(slug="t-task", title="T", kind=TaskKind.PAPER, content_hash="0" * 64)
        session.add(task)
        session.flush()
        studies.add_task(session, study, task, None)
        session.flush()
        session.refresh(study)
        agent = studies.add_agent(session, study, "Bot", "basic", "secret-model-9", "http://x",
                                  None, None)  # fmt: skip
        attempt = studies.create_attempt(session, agent, task, None)
        start = utcnow() - timedelta(hours=3)
        attempt.started_at, attempt.status = start, AttemptStatus.RUNNING
        run = AgentRun(attempt_id=attempt.id, scaffold="basic",
                       model="secret-model-9", settings={"generation_counts": True})  # fmt: skip
        session.add(run)
        session.flush()
        steps = [
            ("message", "system", "You are an AI researcher", None, 0.0),
            ("message", "assistant", None, [{"id": "c1", "type": "function",
             "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}], 1800.0),
            ("message", "tool", "reproduce.sh", None, 1900.0),
        ]  # fmt: skip
        for seq, (kind, role, content, calls, working) in enumerate(steps, 1):
            at = start + timedelta(seconds=working)
            session.add(TranscriptEntry(
                run_id=run.id, seq=seq, kind=kind, role=role, content=content, tool_calls=calls,
                tool_call_id="c1" if role == "tool" else None,
                tool_name="bash" if role == "tool" else None,
                exit_code=0 if role == "tool" else None,
                started_at=at, ended_at=at, working_s=working,
            ))  # fmt: skip
        session.add(Snapshot(attempt_id=attempt.id, kind=SnapshotKind.CHECKPOINT,
                             due_working_s=3600.0, taken_working_s=3600.0,
                             taken_at=start + timedelta(hours=1),
                             manifest_sha256="a" * 64))  # fmt: skip
        return attempt.id


def test_coordinator_reads_the_transcript_on_the_timeline(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    attempt_id = _agent_attempt_with_transcript(ctx)
    login(client, users[Role.COORDINATOR].email)
    detail = client.get(f"/attempts/{attempt_id}").get_data(as_text=True)
    assert f"/attempts/{attempt_id}/transcript" in detail
    page = client.get(f"/attempts/{attempt_id}/transcript")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert "You are an AI researcher" in html and "bash({&#34;cmd&#34;: &#34;ls&#34;})" in html
    assert "checkpoint #" in html  # steps before the 1 h checkpoint are placed in it
    assert "secret-model-9" in html
    export = client.get(f"/attempts/{attempt_id}/transcript.jsonl")
    lines = [json.loads(line) for line in export.get_data(as_text=True).splitlines()]
    assert lines[0]["model"] == "secret-model-9" and [e["seq"] for e in lines[1:]] == [1, 2, 3]
    assert lines[3]["role"] == "tool" and lines[3]["tool_call_id"] == "c1"


def test_graders_and_participants_never_see_a_transcript(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    attempt_id = _agent_attempt_with_transcript(ctx)
    for role in (Role.GRADER, Role.ANALYST, Role.PARTICIPANT):
        viewer = client.application.test_client()
        login(viewer, users[role].email)
        assert viewer.get(f"/attempts/{attempt_id}/transcript").status_code == 403
        assert viewer.get(f"/attempts/{attempt_id}/transcript.jsonl").status_code == 403


def test_a_human_attempt_has_no_transcript(ctx: Context, client: FlaskClient, users: Users) -> None:
    attempt_id = _agent_attempt_with_transcript(ctx)
    login(client, users[Role.COORDINATOR].email)
    with ctx.session() as session:
        session.query(AgentRun).delete()
    page = client.get(f"/attempts/{attempt_id}/transcript").get_data(as_text=True)
    assert "has no agent transcript" in page
    assert client.get(f"/attempts/{attempt_id}/transcript.jsonl").status_code == 404


def test_blacklist_hits_are_shown_to_coordinators_with_their_evidence(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    attempt_id = _agent_attempt_with_transcript(ctx)
    with ctx.session() as session:
        session.add(BlacklistHit(attempt_id=attempt_id, source="shell_history",
                                 rule="https://github.com/x/y", evidence="git clone https://github.com/x/y",
                                 location="/home/participant/.bash_history line 2",
                                 evidence_key="k" * 64))  # fmt: skip
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/attempts/{attempt_id}").get_data(as_text=True)
    assert "Blacklist monitor: 1 hit to review" in page
    assert "git clone https://github.com/x/y" in page and ".bash_history line 2" in page
