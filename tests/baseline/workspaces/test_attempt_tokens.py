"""Per-attempt tokens: scope, revocation, one workspace token at a time (no Docker needed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import select

from baseline.context import Context
from baseline.errors import Conflict, Forbidden
from baseline.models import Attempt, AttemptStatus, AttemptToken, Role, Task, TaskKind, utcnow
from baseline.people import accounts
from baseline.studies import studies
from baseline.workspaces import attempt_tokens
from tests import cli_entry
from tests.conftest import Users


def _attempts(ctx: Context, users: Users) -> tuple[int, int]:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Tokens"), None)
        task = Task(slug="t", title="T", kind=TaskKind.PAPER, content_hash="0" * 64)
        session.add(task)
        session.flush()
        studies.add_task(session, study, task, None)
        me = studies.enroll_human(session, study.id, session.merge(users[Role.PARTICIPANT]), None)
        agent = studies.add_agent(session, study, "api agent", "api", "m", "", {}, None)
        return (
            studies.create_attempt(session, me, task, None).id,
            studies.create_attempt(session, agent, task, None).id,
        )


def _set_status(ctx: Context, attempt_id: int, status: AttemptStatus, ended: bool = False) -> None:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.status = status
        attempt.started_at = utcnow()
        if ended:
            attempt.ended_at = utcnow()
            attempt_tokens.revoke_all(session, attempt_id)


def test_a_token_opens_its_own_attempt_only(ctx: Context, users: Users) -> None:
    mine, other = _attempts(ctx, users)
    with ctx.session() as session:
        attempt = session.get(Attempt, mine)
        assert attempt is not None
        secret = attempt_tokens.issue(session, attempt, attempt_tokens.AGENT, None)
        stored = session.scalar(select(AttemptToken))
        assert stored is not None and secret not in (stored.token_hash, stored.prefix)
    with ctx.session() as session, pytest.raises(Conflict, match="has not started"):
        attempt_tokens.authenticate(session, secret, mine)
    _set_status(ctx, mine, AttemptStatus.RUNNING)
    with ctx.session() as session:
        caller = attempt_tokens.authenticate(session, secret, mine)
        assert (caller.attempt_id, caller.kind) == (mine, attempt_tokens.AGENT)
        with pytest.raises(Forbidden, match="another attempt"):
            attempt_tokens.authenticate(session, secret, other)
        with pytest.raises(attempt_tokens.TokenRefused):
            attempt_tokens.authenticate(session, "bat_unknown", mine)
        with pytest.raises(attempt_tokens.TokenRefused):
            attempt_tokens.authenticate(session, "not-an-attempt-token", mine)
    _set_status(ctx, mine, AttemptStatus.SUBMITTED, ended=True)
    with ctx.session() as session:
        with pytest.raises(attempt_tokens.TokenRefused):
            attempt_tokens.authenticate(session, secret, mine)
        attempt = session.get(Attempt, mine)
        assert attempt is not None
        with pytest.raises(Conflict):
            attempt_tokens.issue(session, attempt, attempt_tokens.AGENT, None)


def test_a_new_workspace_token_replaces_the_previous_one(ctx: Context, users: Users) -> None:
    mine, _ = _attempts(ctx, users)
    _set_status(ctx, mine, AttemptStatus.RUNNING)
    with ctx.session() as session:
        attempt = session.get(Attempt, mine)
        assert attempt is not None
        agent = attempt_tokens.issue(session, attempt, attempt_tokens.AGENT, None)
        first = attempt_tokens.issue(session, attempt, attempt_tokens.WORKSPACE, None)
        second = attempt_tokens.issue(session, attempt, attempt_tokens.WORKSPACE, None)
    with ctx.session() as session:
        with pytest.raises(attempt_tokens.TokenRefused):
            attempt_tokens.authenticate(session, first, mine)
        assert attempt_tokens.authenticate(session, second, mine).kind == "workspace"
        assert attempt_tokens.authenticate(session, agent, mine).kind == "agent"


def test_the_credentials_name_the_attempt_and_the_relay() -> None:
    body = json.loads(attempt_tokens.config_json(7, "bat_x", attempt_tokens.relay_url()))
    assert body == {"attempt_id": 7, "token": "bat_x", "url": "http://127.0.0.1:8749"}


def test_cli_issues_an_agent_token(tmp_path: Path) -> None:
    from baseline.config import Settings
    from baseline.migrate import upgrade

    db = f"sqlite:///{tmp_path / 'baseline.db'}"
    upgrade(db)
    ctx = Context.from_settings(Settings(home=tmp_path, database_url=db, secret_key="k"))
    with ctx.session() as session:
        participant = accounts.create_user(
            session, "p@test.example", "P", "correct horse battery", Role.PARTICIPANT
        )
    mine, _ = _attempts(ctx, Users({Role.PARTICIPANT: participant}))
    ctx.engine.dispose()
    env = cli_entry.home_env(tmp_path)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli_entry.run_here(["agent", "token", *args], env)

    issued = cli(str(mine))
    assert issued.returncode == 0, issued.stderr
    secret = issued.stdout.strip()
    assert secret.startswith("bat_")
    ctx = Context.from_settings(Settings(home=tmp_path, database_url=db, secret_key="k"))
    with ctx.session() as session:
        stored = session.scalar(select(AttemptToken))
        assert stored is not None and stored.kind == "agent" and stored.attempt_id == mine
    ctx.engine.dispose()
    missing = cli("999")
    assert missing.returncode == 1 and missing.stderr.strip() == "error: no attempt with id 999"
