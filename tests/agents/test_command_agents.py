"""Command agents without Docker: the passthrough's keys, limits and ledger, and enrolment."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from flask.testing import FlaskClient
from sqlalchemy import select

from agents.command import command_from_flat
from agents.settings import SettingsError, from_flat
from baseline.attempts.snapshots import store_for
from baseline.context import Context
from baseline.errors import InvalidInput
from baseline.models import (
    AgentRun,
    Attempt,
    AttemptStatus,
    ModelCall,
    Participant,
    Role,
    Study,
    TranscriptEntry,
)
from baseline.people import accounts
from baseline.runs import model_keys
from baseline.runs.model_passthrough import Passthrough, ProxyRequest, parse_answer
from baseline.studies import agent_enrolment, studies
from baseline.tasks import tasks
from tests.baseline.attempt_world import running_command_run
from tests.conftest import Users, json_of, login
from tests.fake_openai import FakeOpenAI

PRICES = {"input_usd_per_mtok": 2.0, "output_usd_per_mtok": 8.0}
PROVIDER_KEY = "sk-provider-secret-c11"
COMMAND = {"command": "my-agent --fast", "command_version": "1.2.3"}


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer=lambda body: "hello from the model") as server:
        yield server


def _passthrough(ctx: Context, fake: FakeOpenAI, **limits: object) -> tuple[Passthrough, str]:
    attempt_id, run_id = running_command_run(ctx)
    settings = from_flat(fake.base_url, "pinned-model", {**PRICES, **limits})
    with ctx.session() as session:
        key = model_keys.issue(session, attempt_id)
    proxy = Passthrough(ctx, attempt_id, run_id, settings, store_for(ctx),
                        environ={"OPENAI_API_KEY": PROVIDER_KEY})  # fmt: skip
    return proxy, key


def _chat(key: str, path: str = "/v1/chat/completions") -> ProxyRequest:
    body = {"model": "some-pricier-model", "messages": [{"role": "user", "content": "hi" * 40}]}
    return ProxyRequest("POST", path, {"authorization": f"Bearer {key}"}, json.dumps(body).encode())


def _error(body: bytes) -> dict[str, object]:
    error = json.loads(body)["error"]
    assert isinstance(error, dict)
    return error


def test_own_key_passes_with_the_provider_key_and_is_logged(ctx: Context, fake: FakeOpenAI) -> None:
    proxy, key = _passthrough(ctx, fake)
    answer = proxy.handle(_chat(key))
    assert answer.status == 200, answer.body
    assert json.loads(answer.body)["choices"][0]["message"]["content"] == "hello from the model"
    assert fake.authorizations == [f"Bearer {PROVIDER_KEY}"]  # the agent's key never goes out
    assert fake.requests[0].body["model"] == "pinned-model"  # the enrolled model, not the asked
    with ctx.session() as session:
        (call,) = session.scalars(select(ModelCall)).all()
        run = session.get(AgentRun, proxy.run_id)
        (entry,) = session.scalars(select(TranscriptEntry)).all()
        assert run is not None
        assert call.purpose == "agent" and call.attempt_id == proxy.attempt_id
        assert call.prompt_tokens == run.prompt_tokens > 0
        assert call.completion_tokens == run.completion_tokens > 0
        assert call.cost_usd == pytest.approx(run.cost_usd) and run.cost_usd > 0
        assert entry.kind == "model_call" and "hello from the model" in (entry.content or "")
        assert entry.output_sha256 is not None and run.steps == 1


def test_a_key_of_another_attempt_is_refused(ctx: Context, fake: FakeOpenAI) -> None:
    proxy, _ = _passthrough(ctx, fake)
    other_attempt, _ = running_command_run(ctx)
    with ctx.session() as session:
        other_key = model_keys.issue(session, other_attempt)
    for key in (other_key, "bl-model-forged", PROVIDER_KEY, ""):
        refused = proxy.handle(_chat(key))
        assert refused.status == 401
        assert _error(refused.body)["code"] == "invalid_api_key"
    assert fake.authorizations == []  # nothing reached the provider
    with ctx.session() as session:
        assert session.scalars(select(ModelCall)).all() == []


def test_revoked_keys_and_ended_attempts_are_refused(ctx: Context, fake: FakeOpenAI) -> None:
    proxy, key = _passthrough(ctx, fake)
    with ctx.session() as session:
        attempt = session.get(Attempt, proxy.attempt_id)
        assert attempt is not None
        attempt.status = AttemptStatus.ENDED
    ended = proxy.handle(_chat(key))
    assert ended.status == 403 and _error(ended.body)["code"] == "attempt_not_live"
    with ctx.session() as session:
        assert model_keys.revoke_all(session, proxy.attempt_id) == 1
    assert proxy.handle(_chat(key)).status == 401


def test_past_the_token_limit_calls_are_refused_openai_style(
    ctx: Context, fake: FakeOpenAI
) -> None:
    proxy, key = _passthrough(ctx, fake, token_limit=5)
    assert proxy.handle(_chat(key)).status == 200  # this call crosses the limit
    refused = proxy.handle(_chat(key))
    assert refused.status == 429
    error = _error(refused.body)
    assert error["type"] == "insufficient_quota" and "token limit" in str(error["message"])
    assert len(fake.authorizations) == 1


def test_only_model_routes_pass(ctx: Context, fake: FakeOpenAI) -> None:
    proxy, key = _passthrough(ctx, fake)
    assert proxy.handle(_chat(key, "/v1/files")).status == 404
    assert proxy.handle(ProxyRequest("GET", "/v1/models", {"authorization": f"Bearer {key}"},
                                     b"")).status == 200  # fmt: skip
    bad = ProxyRequest("POST", "/v1/chat/completions", {"authorization": f"Bearer {key}"}, b"{")
    assert proxy.handle(bad).status == 400


def test_streamed_answers_are_counted() -> None:
    events = (
        'data: {"choices": [{"delta": {"content": "he"}}]}\n\n'
        'data: {"choices": [{"delta": {"content": "llo"}}]}\n\n'
        'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}\n\n'
        "data: [DONE]\n\n"
    )
    usage, text, _ = parse_answer(events.encode(), "text/event-stream; charset=utf-8")
    assert (usage.prompt_tokens, usage.completion_tokens, text) == (7, 3, "hello")


def test_command_settings_are_validated() -> None:
    flat = {**COMMAND, **PRICES, "command_env": {"MODE": "full"}}
    spec, settings = command_from_flat("http://x/v1", "m", flat)
    assert spec.command == "my-agent --fast" and settings.model.model == "m"
    for bad in ({**PRICES}, {**COMMAND, **PRICES, "command_env": {"OPENAI_API_KEY": "x"}},
                {**COMMAND, **PRICES, "command_env": {"1BAD": "x"}}, {**COMMAND}):  # fmt: skip
        with pytest.raises(SettingsError):
            command_from_flat("http://x/v1", "m", bad)


def _study(ctx: Context) -> int:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Command study"), None)
        for task in tasks.import_demo_tasks(session, ctx.settings):
            studies.add_task(session, study, task, None)
        return study.id


def test_command_agents_enrol_from_the_domain_api_and_cli(
    ctx: Context, client: FlaskClient, users: Users, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    study_id = _study(ctx)
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        with pytest.raises(InvalidInput, match="command"):
            agent_enrolment.enrol(session, study, name="x", scaffold="command", model="m",
                                  endpoint="http://x/v1", settings=PRICES, runs_per_task=1,
                                  actor_id=None)  # fmt: skip
        coordinator = accounts.issue_token(session, session.merge(users[Role.COORDINATOR]), "t")
    body = {"name": "Ext", "scaffold": "command", "model": "m", "endpoint": "http://x/v1",
            "settings": {**PRICES, **COMMAND}, "runs_per_task": 1}  # fmt: skip
    url = f"/api/v1/studies/{study_id}/agent-enrolments"
    made = client.post(url, json=body, headers={"Authorization": f"Bearer {coordinator}"})
    assert made.status_code == 201, made.json
    assert json_of(made)["participant"]["group"] == "command:m"
    bad = client.post(url, json={**body, "settings": PRICES},
                      headers={"Authorization": f"Bearer {coordinator}"})  # fmt: skip
    assert bad.status_code == 422 and "command" in json_of(bad)["message"]

    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token and "command: an external agent program" in page
    form = {"csrf_token": token.group(1), "name": "Form ext", "scaffold": "command", "model": "m",
            "endpoint": "http://x/v1", "runs_per_task": "1",
            **{f"setting_{k}": str(v) for k, v in {**PRICES, **COMMAND}.items()}}  # fmt: skip
    done = client.post(f"/studies/{study_id}/agents", data=form, follow_redirects=True)
    assert "Agent enrolled with 2 attempts." in done.get_data(as_text=True)

    from baseline.cli import cli

    monkeypatch.setenv("BASELINE_DATABASE_URL", ctx.settings.database_url)
    monkeypatch.setenv("BASELINE_HOME", str(ctx.settings.home))
    result = CliRunner().invoke(cli, [
        "agent", "enrol", "--study", "Command study", "--name", "Cli ext", "--scaffold",
        "command", "--model", "m", "--endpoint", "http://x/v1", "--set", "command=my-agent",
        "--set", "command_version=0.9", "--set", 'command_env={"MODE": "x"}',
        "--set", "input_usd_per_mtok=1", "--set", "output_usd_per_mtok=2",
    ])  # fmt: skip
    # Other settings than the group command:m holds: refused unless named (or pooled).
    assert result.exit_code == 1 and "group 'command:m' holds" in str(result.exception)
    result = CliRunner().invoke(cli, [
        "agent", "enrol", "--study", "Command study", "--name", "Cli ext", "--scaffold",
        "command", "--model", "m", "--endpoint", "http://x/v1", "--set", "command=my-agent",
        "--set", "command_version=0.9", "--set", 'command_env={"MODE": "x"}',
        "--set", "input_usd_per_mtok=1", "--set", "output_usd_per_mtok=2",
        "--group", "my-agent 0.9",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    with ctx.session() as session:
        cli_agent = session.scalar(select(Participant).where(Participant.display_name == "Cli ext"))
        assert cli_agent is not None and cli_agent.agent_limits is not None
        assert cli_agent.agent_limits["command_env"] == {"MODE": "x"}
        groups = {p.display_name: p.group for p in session.scalars(select(Participant))}
        assert groups == {"Ext": "command:m", "Form ext": "command:m", "Cli ext": "my-agent 0.9"}


def test_the_transcript_page_shows_the_command_and_its_calls(
    ctx: Context, fake: FakeOpenAI, client: FlaskClient, users: Users
) -> None:
    proxy, key = _passthrough(ctx, fake)
    with ctx.session() as session:
        run = session.get(AgentRun, proxy.run_id)
        assert run is not None
        run.settings = {**COMMAND, **PRICES}
    assert proxy.handle(_chat(key)).status == 200
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/attempts/{proxy.attempt_id}/transcript").get_data(as_text=True)
    assert "<code>my-agent --fast</code> (version 1.2.3)" in page
    assert "chat/completions → HTTP 200: hello from the model" in page
    exported = client.get(f"/attempts/{proxy.attempt_id}/transcript.jsonl").get_data(as_text=True)
    assert '"kind": "model_call"' in exported


def test_a_provider_outage_is_a_rate_limit_pause_until_a_call_succeeds(ctx: Context) -> None:
    from baseline.models import Pause, PauseReason

    with FakeOpenAI(answer=lambda body: "back", fault_plan=["429", "500"]) as fake:
        proxy, key = _passthrough(ctx, fake)
        statuses = [proxy.handle(_chat(key)).status for _ in range(3)]
    assert statuses == [429, 500, 200]  # the provider's answers reach the agent as they are
    with ctx.session() as session:
        (pause,) = session.scalars(select(Pause).where(Pause.reason == PauseReason.RATE_LIMIT))
        entries = session.scalars(select(TranscriptEntry).order_by(TranscriptEntry.seq)).all()
        assert [e.kind for e in entries] == ["model_error", "model_error", "model_call"]
        assert pause.started_at == entries[0].started_at  # from the failing call's start
        assert pause.ended_at == entries[2].started_at  # to the start of the one that worked
        attempt = session.get(Attempt, proxy.attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.RUNNING
