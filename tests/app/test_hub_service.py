"""The portal's hub routes without a hub: service-token checks, login tokens, clear refusals.

The hub's own behaviour with these answers is in tests/app/test_hub.py (real hub and Docker);
here the rules themselves: a token works once, expires, is only for the participant's own live
attempt with a running workspace, and the hub-service routes answer nobody but the hub.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from markupsafe import escape
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.attempts import attempts
from baseline.config import Settings
from baseline.context import Context
from baseline.errors import Forbidden
from baseline.hub import hub_sessions
from baseline.hub_settings import hub_config
from baseline.models import (
    Attempt,
    AuditEvent,
    HubLoginToken,
    PauseReason,
    Role,
    User,
    Workspace,
    WorkspaceStatus,
    utcnow,
)
from baseline.people import logins
from baseline.workspaces import terminal_records
from tests.baseline.attempt_world import started_human_attempt
from tests.conftest import Users, login


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    home = tmp_path / "home"
    home.mkdir()
    # A hub port nothing listens on: "Open workspace" must say the hub is down.
    return Settings(home=home, database_url=database_url, secret_key="s", extra={"hub_port": "9"})


@dataclass
class Live:
    attempt_id: int
    user_id: int
    email: str
    token: str  # the hub's service token


def _live_attempt(
    ctx: Context, tmp_path: Path, running: bool = True, consented: bool = True
) -> Live:
    human = started_human_attempt(
        ctx,
        tmp_path,
        docker_url="unix:///var/run/docker.sock",
        running=running,
        consented=consented,
    )
    token = hub_config(ctx.settings).service_token()
    return Live(human.attempt_id, human.user_id, human.email, token)


def _portal_session(session: Session, user: User) -> int:
    """A portal session of `user` (its row id), the one a login token is issued from."""
    found = logins.live_session_id(session, logins.open_session(session, user))
    assert found is not None
    return found


def _redeem(client: FlaskClient, token: str, service: str) -> tuple[int, dict[str, object]]:
    answer = client.post(
        "/hub-service/redeem",
        json={"token": token, "hub_session": "hub-session-of-the-browser"},
        headers={"Authorization": f"Bearer {service}"} if service else {},
    )
    return answer.status_code, answer.get_json()


def test_hub_service_routes_answer_only_the_hub(
    ctx: Context, client: FlaskClient, tmp_path: Path
) -> None:
    live = _live_attempt(ctx, tmp_path)
    query = f"/hub-service/server?user=u{live.user_id}&name=a{live.attempt_id}"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
        assert client.get(query, headers=headers).status_code == 403
        assert (
            client.post("/hub-service/redeem", json={"token": "x"}, headers=headers).status_code
            == 403
        )
    answer = client.get(query, headers={"Authorization": f"Bearer {live.token}"})
    assert answer.status_code == 200
    assert answer.get_json() == {
        "attempt_id": live.attempt_id,
        "docker_url": "unix:///var/run/docker.sock",
        "container": f"ws-a{live.attempt_id}-test",
    }


def test_login_token_is_single_use_short_lived_and_starts_the_clock(
    ctx: Context, client: FlaskClient, tmp_path: Path
) -> None:
    live = _live_attempt(ctx, tmp_path)
    with ctx.session() as session:
        user = session.get(User, live.user_id)
        assert user is not None
        grant = hub_sessions.issue_login_token(
            session, user, live.attempt_id, portal_session=_portal_session(session, user)
        )
        stale = hub_sessions.issue_login_token(
            session,
            user,
            live.attempt_id,
            portal_session=_portal_session(session, user),
            now=utcnow() - timedelta(minutes=10),
        )
    assert grant.next_path == f"/hub/spawn/u{live.user_id}/a{live.attempt_id}"
    status, body = _redeem(client, stale.token, live.token)
    assert status == 403 and "expired" in str(body["message"])
    status, body = _redeem(client, grant.token, live.token)
    assert status == 200
    assert body == {
        "user": f"u{live.user_id}",
        "attempt_id": live.attempt_id,
        "clock_started": True,
    }
    with ctx.session() as session:
        attempt = session.get(Attempt, live.attempt_id)
        assert attempt is not None and attempt.first_login_at is not None
    status, _ = _redeem(client, grant.token, live.token)
    assert status == 403  # used
    status, _ = _redeem(client, "never-issued", live.token)
    assert status == 403


def test_server_target_is_only_the_users_own_live_attempt(
    ctx: Context, client: FlaskClient, tmp_path: Path
) -> None:
    mine = _live_attempt(ctx, tmp_path)
    theirs = _live_attempt(ctx, tmp_path)
    auth = {"Authorization": f"Bearer {mine.token}"}
    cases = {
        f"user=u{mine.user_id}&name=a{theirs.attempt_id}": 404,  # another person's attempt
        f"user=u{mine.user_id}&name=": 404,  # the default server is not an attempt
        f"user=admin&name=a{mine.attempt_id}": 404,
        f"user=u99999&name=a{mine.attempt_id}": 403,
    }
    for query, expected in cases.items():
        answer = client.get(f"/hub-service/server?{query}", headers=auth)
        assert answer.status_code == expected, query
        assert answer.get_json()["message"]
    stopped = _live_attempt(ctx, tmp_path, running=False)
    answer = client.get(
        f"/hub-service/server?user=u{stopped.user_id}&name=a{stopped.attempt_id}", headers=auth
    )
    assert answer.status_code == 409 and "not running" in answer.get_json()["message"]


def _csrf(client: FlaskClient, attempt_id: int) -> str:
    page = client.get(f"/attempts/{attempt_id}").get_data(as_text=True)
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found and 'id="open-workspace"' in page
    return found.group(1)


def test_open_workspace_says_why_it_cannot(
    ctx: Context, app: Flask, client: FlaskClient, tmp_path: Path
) -> None:
    live = _live_attempt(ctx, tmp_path)
    other = _live_attempt(ctx, tmp_path)
    login(client, live.email, "pw-long-enough-1")
    csrf = _csrf(client, live.attempt_id)
    # The hub is down (nothing on its port): a 409 that says so; no token spent, no clock start.
    down = client.post(f"/attempts/{live.attempt_id}/workspace", data={"csrf_token": csrf})
    assert down.status_code == 409
    assert "JupyterHub is not answering" in down.get_data(as_text=True)
    # Another participant's attempt: missing.
    foreign = client.post(f"/attempts/{other.attempt_id}/workspace", data={"csrf_token": csrf})
    assert foreign.status_code == 404
    # A workspace that is down: said before anything reaches the hub.
    with ctx.session() as session:
        workspace = session.query(Workspace).filter_by(attempt_id=live.attempt_id).one()
        workspace.status = WorkspaceStatus.DEAD
    dead = client.post(f"/attempts/{live.attempt_id}/workspace", data={"csrf_token": csrf})
    assert dead.status_code == 409 and "not running (dead)" in dead.get_data(as_text=True)
    with ctx.session() as session:
        attempt = session.get(Attempt, live.attempt_id)
        assert attempt is not None and attempt.first_login_at is None


def test_participant_without_a_live_attempt_is_told_so(
    ctx: Context, client: FlaskClient, tmp_path: Path
) -> None:
    live = _live_attempt(ctx, tmp_path)
    login(client, live.email, "pw-long-enough-1")
    listing = client.get("/attempts/").get_data(as_text=True)
    assert 'id="no-live-attempt"' not in listing
    # the list's own button opens the live attempt's workspace, as its notice promises
    form = r'action="([^"]+)"[^>]*>\s*<input[^>]*>\s*<button class="open-workspace"[^>]*>([^<]+)<'
    opens = re.findall(form, listing)
    assert opens == [(f"/attempts/{live.attempt_id}/workspace", "Start working")], opens
    csrf = _csrf(client, live.attempt_id)
    attempts.disqualify(ctx, live.attempt_id, None, "test: attempt closed")
    listing = client.get("/attempts/").get_data(as_text=True)
    assert 'id="no-live-attempt"' in listing and "no workspace to open" in listing
    assert "/workspace" not in listing and "open-workspace" not in listing
    page = client.get(f"/attempts/{live.attempt_id}").get_data(as_text=True)
    assert 'id="open-workspace"' not in page and "test: attempt closed" in page
    closed = client.post(f"/attempts/{live.attempt_id}/workspace", data={"csrf_token": csrf})
    assert closed.status_code == 409
    assert "disqualified (test: attempt closed): its workspace cannot be opened" in (
        closed.get_data(as_text=True)
    )


def test_a_redemption_names_the_browsers_hub_session(
    ctx: Context, client: FlaskClient, tmp_path: Path
) -> None:
    """The hub login a token makes is bound to the browser's hub session: a redemption that does
    not name it is refused, saying so, and leaves the token unspent."""
    live = _live_attempt(ctx, tmp_path)
    with ctx.session() as session:
        user = session.get(User, live.user_id)
        assert user is not None
        grant = hub_sessions.issue_login_token(
            session, user, live.attempt_id, portal_session=_portal_session(session, user)
        )
    headers = {"Authorization": f"Bearer {live.token}"}
    for body in ({"token": grant.token}, {"token": grant.token, "hub_session": ""}):
        refused = client.post("/hub-service/redeem", json=body, headers=headers)
        assert refused.status_code == 422
        assert "hub_session: required" in refused.get_json()["message"]
    status, _ = _redeem(client, grant.token, live.token)
    assert status == 200


def test_opening_the_workspace_again_ends_an_idle_pause(
    ctx: Context, client: FlaskClient, tmp_path: Path
) -> None:
    live = _live_attempt(ctx, tmp_path)
    assert attempts.first_login(ctx, live.attempt_id, live.user_id)
    attempts.pause(ctx, live.attempt_id, PauseReason.IDLE, None, note="no activity")
    with ctx.session() as session:
        user = session.get(User, live.user_id)
        assert user is not None
        grant = hub_sessions.issue_login_token(
            session, user, live.attempt_id, portal_session=_portal_session(session, user)
        )
    status, body = _redeem(client, grant.token, live.token)
    assert status == 200 and body["clock_started"] is False
    with ctx.session() as session:
        attempt = session.get(Attempt, live.attempt_id)
        assert attempt is not None and attempt.status.value == "running"
        (idle,) = [p for p in attempt.pauses if p.reason is PauseReason.IDLE]
        assert idle.ended_at is not None


def test_open_workspace_needs_the_studys_consent_first(
    ctx: Context, client: FlaskClient, tmp_path: Path
) -> None:
    live = _live_attempt(ctx, tmp_path, consented=False)
    other = _live_attempt(ctx, tmp_path, consented=False)
    login(client, live.email, "pw-long-enough-1")
    csrf = _csrf(client, live.attempt_id)
    # Not accepted yet: "Open workspace" leads to the consent text, no token is spent.
    first = client.post(f"/attempts/{live.attempt_id}/workspace", data={"csrf_token": csrf})
    assert first.status_code == 302
    way_in = f"/attempts/{live.attempt_id}/consent?continue=workspace"
    assert first.headers["Location"].endswith(way_in)
    page = client.get(f"/attempts/{live.attempt_id}/consent").get_data(as_text=True)
    assert str(escape(terminal_records.DEFAULT_CONSENT_TEXT)) in page
    assert 'id="consent-form"' in page
    unticked = client.post(f"/attempts/{live.attempt_id}/consent", data={"csrf_token": csrf})
    assert unticked.status_code == 422
    # Someone else's attempt: missing, and nothing recorded for them.
    foreign = client.post(
        f"/attempts/{other.attempt_id}/consent", data={"csrf_token": csrf, "accept": "yes"}
    )
    assert foreign.status_code == 404
    accepted = client.post(
        f"/attempts/{live.attempt_id}/consent", data={"csrf_token": csrf, "accept": "yes"}
    )
    assert accepted.status_code == 302
    with ctx.session() as session:
        attempt = session.get(Attempt, live.attempt_id)
        assert attempt is not None and attempt.participant.consent_accepted_at is not None
        assert terminal_records.has_consented(attempt.participant)
        assert session.scalar(
            select(AuditEvent.id).where(
                AuditEvent.action == "consent.accept",
                AuditEvent.target_id == str(attempt.participant_id),
            )
        )
        assert session.scalars(select(HubLoginToken)).all() == []
        stranger = session.get(Attempt, other.attempt_id)
        assert stranger is not None and stranger.participant.consent_accepted_at is None
    page = client.get(f"/attempts/{live.attempt_id}/consent").get_data(as_text=True)
    assert 'id="consent-accepted"' in page
    # Accepted: past the consent, to the next check (here: the hub is down).
    down = client.post(f"/attempts/{live.attempt_id}/workspace", data={"csrf_token": csrf})
    assert down.status_code == 409 and "JupyterHub is not answering" in down.get_data(as_text=True)
    # A changed consent text is asked for again.
    with ctx.session() as session:
        attempt = session.get(Attempt, live.attempt_id)
        assert attempt is not None
        attempt.participant.study.consent_text = "Now we also record your webcam."
    again = client.post(f"/attempts/{live.attempt_id}/workspace", data={"csrf_token": csrf})
    assert again.status_code == 302 and again.headers["Location"].endswith(way_in)
    # Accepted on the way in, it goes on to the workspace (not back to the attempt page): here
    # the hub is down, and the answer says so.
    onward = client.post(
        way_in, data={"csrf_token": csrf, "accept": "yes", "continue": "workspace"}
    )
    assert onward.status_code == 409
    assert "JupyterHub is not answering" in onward.get_data(as_text=True)


def test_observe_is_staff_only_audited_and_opens_one_server(
    ctx: Context, client: FlaskClient, tmp_path: Path, users: Users
) -> None:
    live = _live_attempt(ctx, tmp_path)
    staff = users[Role.COORDINATOR]
    with ctx.session() as session:
        coordinator = session.get(User, staff.id)
        participant = session.get(User, live.user_id)
        assert coordinator is not None and participant is not None
        grant = hub_sessions.issue_observe_token(
            session,
            coordinator,
            live.attempt_id,
            portal_session=_portal_session(session, coordinator),
        )
        with pytest.raises(Forbidden):
            hub_sessions.issue_observe_token(
                session,
                participant,
                live.attempt_id,
                portal_session=_portal_session(session, participant),
            )
    assert grant.next_path == f"/user/u{live.user_id}/a{live.attempt_id}/lab"
    status, body = _redeem(client, grant.token, live.token)
    server = f"u{live.user_id}/a{live.attempt_id}"
    # The staff member logs in as themselves, with a role for that one server; no clock start.
    assert status == 200 and body["user"] == f"u{staff.id}" and body["clock_started"] is False
    roles = body["roles"]
    assert isinstance(roles, list) and len(roles) == 1
    assert f"access:servers!server={server}" in roles[0]["scopes"]
    assert not [s for s in roles[0]["scopes"] if "!" not in s]  # nothing unfiltered
    with ctx.session() as session:
        actions = session.scalars(
            select(AuditEvent.action).where(AuditEvent.actor_id == staff.id)
        ).all()
        attempt = session.get(Attempt, live.attempt_id)
        assert attempt is not None and attempt.first_login_at is None
    assert "hub.observe" in actions and "hub.observe_login" in actions
    # Only coordinators and admins have the button's route; the hub down is said.
    for role in (Role.GRADER, Role.ANALYST, Role.PARTICIPANT):
        viewer = client.application.test_client()
        login(viewer, users[role].email)
        assert viewer.post(f"/attempts/{live.attempt_id}/observe").status_code in (400, 403)
    login(client, staff.email)
    # Before the participant's first login the hub does not know them: nothing to observe.
    page = client.get(f"/attempts/{live.attempt_id}").get_data(as_text=True)
    assert 'id="observe-workspace"' not in page and 'id="observe-not-yet"' in page
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found
    early = client.post(f"/attempts/{live.attempt_id}/observe", data={"csrf_token": found.group(1)})
    assert early.status_code == 409 and "not opened JupyterLab yet" in early.get_data(as_text=True)
    attempts.first_login(ctx, live.attempt_id, live.user_id)
    page = client.get(f"/attempts/{live.attempt_id}").get_data(as_text=True)
    assert 'id="observe-workspace"' in page
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found
    down = client.post(f"/attempts/{live.attempt_id}/observe", data={"csrf_token": found.group(1)})
    assert down.status_code == 409 and "JupyterHub is not answering" in down.get_data(as_text=True)
