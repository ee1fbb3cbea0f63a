"""The blacklist monitor: a proxy log, an agent transcript and a shell history (read from a real
Docker workspace) that name a blacklisted URL are each flagged with their evidence; a clean
attempt is not; scanning again adds nothing; a study may disqualify on a hit."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import select

from baseline.attempts import attempts
from baseline.attempts.snapshots import resolve_source
from baseline.context import Context
from baseline.models import (
    AgentRun,
    Attempt,
    AttemptStatus,
    EgressEvent,
    Role,
    TranscriptEntry,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.people import accounts
from baseline.runs import blacklist_monitor
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import egress_gateway, workspaces
from infra.docker_backend import DockerBackend
from infra.egress.rules import parse_blacklist
from tests.agents.agent_world import agent_attempt, cleanup, factory
from tests.docker_env import LOCAL_URL, TEST_LABELS, test_image

__all__ = ["cleanup", "test_image"]

BLACKLISTED = "https://github.com/baseline-demo/digits-baselines"  # the demo task's blacklist
LOGGED = f"GET {BLACKLISTED}/archive/main.zip (refused by the proxy)"


def test_text_matching_follows_the_proxy_rule() -> None:
    rules = parse_blacklist(BLACKLISTED + "\n")
    match = blacklist_monitor.match_text
    assert match(rules, "git clone https://github.com/baseline-demo/digits-baselines.git")
    assert match(rules, "see www.github.com/Baseline-Demo/digits-baselines/blob/main/x.py")
    assert match(rules, "git clone git@github.com:baseline-demo/digits-baselines.git")
    assert not match(rules, "https://github.com/baseline-demo/digits-baselines-other")
    assert not match(rules, "https://github.com/baseline-demo/other and digits-baselines")
    assert not match(rules, "pip install numpy")


def _exec(ctx: Context, attempt_id: int, command: str) -> None:
    with ctx.session() as session:
        workspace = session.scalars(
            select(Workspace).where(Workspace.attempt_id == attempt_id)
        ).one()
        handle = workspaces.handle_of(workspace)
    backend = DockerBackend.from_url(LOCAL_URL, labels=TEST_LABELS)
    try:
        result = backend.exec(handle, ["bash", "-c", command], timeout_s=30, user="participant")
    finally:
        backend.close()
    assert result.exit_code == 0, result.output


def _leave_traces(ctx: Context, attempt_id: int, url: str) -> None:
    """What a participant using `url` leaves behind: a proxy log line, a transcript step, and a
    line in the shell history."""
    _exec(
        ctx, attempt_id, f"echo 'ls' >> ~/.bash_history; echo 'git clone {url}' >> ~/.bash_history"
    )
    with ctx.session() as session:
        workspace = session.scalars(
            select(Workspace).where(Workspace.attempt_id == attempt_id)
        ).one()
        named = {"workspace_id": workspace.id, "workspace_name": workspace.name, "method": "GET"}
        earlier = utcnow() - timedelta(minutes=5)
        session.add(EgressEvent(**named, at=earlier, url=url + "/archive/main.zip",
                                allowed=False, rule=url))  # fmt: skip
        session.add(EgressEvent(**named, url="https://pypi.org/simple/numpy/", allowed=True))
        run = AgentRun(attempt_id=attempt_id, scaffold="basic", model="m", settings={})
        session.add(run)
        session.flush()
        arguments = f'{{"cmd": "curl -sL {url}/raw/x.py"}}'
        calls = [{"id": "c", "type": "function",
                  "function": {"name": "bash", "arguments": arguments}}]  # fmt: skip
        session.add(TranscriptEntry(run_id=run.id, seq=1, kind="message", role="assistant",
                                    content="Let me look at the authors' code.",
                                    tool_calls=calls))  # fmt: skip


@pytest.mark.docker
def test_a_log_a_transcript_and_a_history_are_flagged_a_clean_attempt_is_not(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    dirty = agent_attempt(ctx, test_image, "http://127.0.0.1:9/v1", name="dirty")
    clean = agent_attempt(ctx, test_image, "http://127.0.0.1:9/v1", name="clean")
    _leave_traces(ctx, dirty.attempt_id, BLACKLISTED)
    _leave_traces(ctx, clean.attempt_id, "https://github.com/scikit-learn/scikit-learn")

    reader = blacklist_monitor.workspace_history(
        lambda host: DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)
    )
    hits = blacklist_monitor.scan(ctx, dirty.attempt_id, history_reader=reader)
    by_source = {h.source: h for h in hits}
    assert set(by_source) == {"egress", "transcript", "shell_history"} and len(hits) == 3
    assert (
        by_source["egress"].evidence == f"GET {BLACKLISTED}/archive/main.zip (refused by the proxy)"
    )
    assert by_source["egress"].at is not None
    assert by_source["transcript"].location == "transcript step 1 (assistant)"
    assert f"curl -sL {BLACKLISTED}/raw/x.py" in by_source["transcript"].evidence
    assert by_source["shell_history"].evidence == f"git clone {BLACKLISTED}"
    assert by_source["shell_history"].location == "/home/participant/.bash_history line 2"
    assert {h.rule for h in hits} == {BLACKLISTED}

    assert blacklist_monitor.scan(ctx, clean.attempt_id, history_reader=reader) == []
    assert blacklist_monitor.scan(ctx, dirty.attempt_id, history_reader=reader) == []  # no repeat
    with ctx.session() as session:
        assert len(blacklist_monitor.hits_of(session, dirty.attempt_id)) == 3
        assert blacklist_monitor.hits_of(session, clean.attempt_id) == []


@pytest.mark.docker
def test_a_hit_can_disqualify(ctx: Context, cleanup: None, test_image: str) -> None:
    world = agent_attempt(ctx, test_image, "http://127.0.0.1:9/v1", name="dq")
    _leave_traces(ctx, world.attempt_id, BLACKLISTED)
    hits = blacklist_monitor.scan(
        ctx, world.attempt_id, history_reader=lambda s, a: [], disqualify=True
    )
    assert len(hits) == 2  # the log and the transcript
    with ctx.session() as session:
        attempt = session.get(Attempt, world.attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.DISQUALIFIED
        assert attempt.end_reason == f"blacklisted resource used: {LOGGED}"


@pytest.mark.docker
def test_the_history_of_a_stopped_workspace_is_read_from_what_its_end_collected(
    ctx: Context, cleanup: None, test_image: str
) -> None:
    """An agent's attempt ends and its workspace stops: the participant's home (a tmpfs) went with
    the running container, so the history is read from the records its end collected."""
    world = agent_attempt(ctx, test_image, "http://127.0.0.1:9/v1", name="ended")
    _exec(ctx, world.attempt_id, f"echo 'git clone {BLACKLISTED}' >> ~/.bash_history")
    attempts.submit(ctx, world.attempt_id, None, resolve_source, backend_factory=factory)
    with ctx.session() as session:
        workspace = session.scalars(
            select(Workspace).where(Workspace.attempt_id == world.attempt_id)
        ).one()
        assert workspace.status is WorkspaceStatus.STOPPED

    hits = blacklist_monitor.scan(
        ctx, world.attempt_id, history_reader=blacklist_monitor.workspace_history(factory)
    )
    assert [(h.source, h.evidence, h.location) for h in hits] == [
        ("shell_history", f"git clone {BLACKLISTED}", "/home/participant/.bash_history line 1")
    ]


def test_the_egress_job_flags_a_humans_blacklisted_request(ctx: Context) -> None:
    """A person's workspace fetches a blacklisted URL through the proxy: the portal's periodic
    egress job records the event and flags it at once. Before, the monitor ran after an agent's
    steps only, and a human's request waited for a coordinator's `attempt monitor`."""
    with ctx.session() as session:
        study = studies.create_study(
            session, studies.StudySpec(name="human egress", egress_policy="blacklist"), None
        )
        paper = next(t for t in tasks.import_demo_tasks(session, ctx.settings)
                     if t.slug == "digits-baselines")  # fmt: skip
        studies.add_task(session, study, paper, None)
        user = accounts.create_user(session, "p@test.example", "P", "password123", Role.PARTICIPANT)
        human = studies.create_attempt(
            session, studies.enroll_human(session, study.id, user, None), paper, None
        )
        session.add(
            Workspace(
                attempt_id=human.id, purpose=WorkspacePurpose.ATTEMPT, backend="docker",
                name="human-ws", image="img", hardware_profile="cpu",
                status=WorkspaceStatus.RUNNING,
            )
        )  # fmt: skip
        attempt_id = human.id
    log = egress_gateway.state_dir(ctx.settings) / "events.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    event = {
        "at": utcnow().isoformat(),
        "workspace": "human-ws",
        "method": "GET",
        "url": f"{BLACKLISTED}/archive/main.zip",
        "allowed": False,
        "rule": BLACKLISTED,
    }
    log.write_text(json.dumps(event) + "\n")

    new = blacklist_monitor.egress_job(ctx)
    assert [(h.attempt_id, h.source, h.evidence) for h in new] == [(attempt_id, "egress", LOGGED)]
    with ctx.session() as session:
        assert [h.evidence for h in blacklist_monitor.hits_of(session, attempt_id)] == [LOGGED]
    assert blacklist_monitor.egress_job(ctx) == []  # nothing new, nothing flagged twice
