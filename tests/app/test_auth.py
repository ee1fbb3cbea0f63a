"""Log in/out, CSRF protection on forms, invitations (single use, expiring), API tokens."""

from __future__ import annotations

import re
from datetime import timedelta

from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select

from baseline.context import Context
from baseline.models import (
    Invitation,
    Participant,
    Role,
    Study,
    StudyStatus,
    StudyTask,
    User,
    utcnow,
)
from baseline.people import accounts
from baseline.studies import studies
from baseline.tasks import tasks
from tests.conftest import PASSWORD, Users, json_of, login


def _csrf(client: FlaskClient, path: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).get_data(as_text=True))
    assert match, f"no CSRF token on {path}"
    return match.group(1)


def _invite(ctx: Context, ttl: timedelta, email: str | None = None) -> tuple[int, str]:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Invited study"), None)
        _inv, token = accounts.create_invitation(
            session, Role.PARTICIPANT, ttl, None, study.id, email
        )
        return study.id, token


def test_wrong_password_is_refused(client: FlaskClient, users: Users) -> None:
    token = _csrf(client, "/login")
    response = client.post(
        "/login",
        data={"email": users[Role.ADMIN].email, "password": "nope-nope", "csrf_token": token},
    )
    assert response.status_code == 401
    assert "Wrong e-mail or password" in response.get_data(as_text=True)
    assert client.get("/studies/").status_code == 302


def test_login_logout(client: FlaskClient, users: Users) -> None:
    login(client, users[Role.ANALYST].email)
    assert client.get("/studies/").status_code == 200
    response = client.post("/logout", data={"csrf_token": _csrf(client, "/studies/")})
    assert response.status_code == 302
    assert client.get("/studies/").status_code == 302


def test_login_redirect_stays_on_site(client: FlaskClient, users: Users) -> None:
    token = _csrf(client, "/login")
    response = client.post(
        "/login?next=//evil.example/x",
        data={"email": users[Role.ADMIN].email, "password": PASSWORD, "csrf_token": token},
    )
    assert response.headers["Location"].endswith("/studies/")


def test_session_cookie_is_httponly(client: FlaskClient, users: Users) -> None:
    token = _csrf(client, "/login")
    response = client.post(
        "/login", data={"email": users[Role.ADMIN].email, "password": PASSWORD, "csrf_token": token}
    )
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie


def test_form_without_csrf_token_is_rejected(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    response = client.post("/login", data={"email": users[Role.ADMIN].email, "password": PASSWORD})
    assert response.status_code == 400
    assert "security token is missing" in response.get_data(as_text=True)

    login(client, users[Role.COORDINATOR].email)
    response = client.post("/studies/new", data={"name": "Sneaky", "hardware_profile": "cpu"})
    assert response.status_code == 400
    with ctx.session() as session:
        assert session.scalar(select(Study).where(Study.name == "Sneaky")) is None


def test_form_with_csrf_token_is_accepted(ctx: Context, client: FlaskClient, users: Users) -> None:
    login(client, users[Role.COORDINATOR].email)
    token = _csrf(client, "/studies/new")
    response = client.post(
        "/studies/new",
        data={
            "name": "Proper",
            "hardware_profile": "cpu",
            "csrf_token": token,
            "checkpoint_hours": "1, 4",
            "idle_pause_minutes": "20",
            "snapshot_policy": "paperbench",
        },
    )
    assert response.status_code == 302
    with ctx.session() as session:
        study = session.scalar(select(Study).where(Study.name == "Proper"))
        assert study is not None and study.checkpoint_hours == [1.0, 4.0]
        assert study.idle_pause_minutes == 20.0
        assert study.snapshot_policy == "paperbench"


def test_bad_study_form_shows_clear_error(client: FlaskClient, users: Users) -> None:
    login(client, users[Role.COORDINATOR].email)
    for field, value, message in [
        ("checkpoint_hours", "8, 2", "checkpoint_hours: must be strictly increasing"),
        ("snapshot_policy", "all", "snapshot_policy: expected one of baseline, paperbench"),
    ]:
        token = _csrf(client, "/studies/new")
        response = client.post(
            "/studies/new",
            data={"name": "Bad", "hardware_profile": "cpu", field: value, "csrf_token": token},
        )
        assert response.status_code == 422
        assert message in response.get_data(as_text=True)


def test_invitation_creates_account_and_enrols(ctx: Context, client: FlaskClient) -> None:
    study_id, token = _invite(ctx, timedelta(hours=1))
    page = client.get(f"/invite/{token}")
    assert page.status_code == 200 and "Create your account" in page.get_data(as_text=True)
    response = client.post(
        f"/invite/{token}",
        data={
            "name": "Ada",
            "email": "ada@test.example",
            "password": PASSWORD,
            "csrf_token": _csrf(client, f"/invite/{token}"),
        },
    )
    assert response.status_code == 302
    with ctx.session() as session:
        user = session.scalar(select(User).where(User.email == "ada@test.example"))
        assert user is not None and user.role is Role.PARTICIPANT
        enrolled = session.scalar(select(Participant).where(Participant.user_id == user.id))
        assert enrolled is not None and enrolled.study_id == study_id
    assert client.get(f"/studies/{study_id}").status_code == 200


def test_a_closed_study_offers_no_enrolment_and_refuses_a_participants_invitation(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    """A participant's link to a closed study would fail only in the invited person's hands
    (their enrolment is refused): the coordinator is told at once, and the page says why it
    offers no agent enrolment and no task to add."""
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Closed study"), None)
        studies.set_status(session, study, StudyStatus.CLOSED, None)
        study_id = study.id
        task_id = tasks.import_demo_tasks(session, ctx.settings)[0].id
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    assert 'id="study-not-open"' in page and "it takes no new attempts or participants" in page
    assert "Enrol agent</button>" not in page
    assert 'id="tasks-closed"' in page and "Add task</button>" not in page
    added = client.post(
        f"/studies/{study_id}/tasks",
        data={"task_id": task_id, "csrf_token": _csrf(client, f"/studies/{study_id}")},
        follow_redirects=True,
    ).get_data(as_text=True)
    assert "is closed: it takes no new tasks (make it active again to add them)" in added
    response = client.post(
        f"/studies/{study_id}/invitations",
        data={"role": "participant", "csrf_token": _csrf(client, f"/studies/{study_id}")},
        follow_redirects=True,
    )
    text = response.get_data(as_text=True)
    assert "is closed: it takes no new attempts or participants" in text
    assert "Invitation link" not in text
    with ctx.session() as session:
        assert session.scalar(select(func.count()).select_from(Invitation)) == 0
        token = accounts.issue_token(session, session.merge(users[Role.COORDINATOR]), "api")
    bearer = {"Authorization": f"Bearer {token}"}
    refused = client.post(
        f"/api/v1/studies/{study_id}/invitations", json={"role": "participant"}, headers=bearer
    )
    assert refused.status_code == 409, refused.get_data(as_text=True)
    assert "is closed: it takes no new attempts or participants" in json_of(refused)["message"]
    task_refused = client.post(
        f"/api/v1/studies/{study_id}/tasks", json={"task_id": task_id}, headers=bearer
    )
    assert task_refused.status_code == 409, task_refused.get_data(as_text=True)
    assert "is closed: it takes no new tasks" in json_of(task_refused)["message"]
    with ctx.session() as session:
        assert session.scalar(select(func.count()).select_from(StudyTask)) == 0
    grader = client.post(
        f"/api/v1/studies/{study_id}/invitations", json={"role": "grader"}, headers=bearer
    )
    assert grader.status_code == 201, grader.get_data(as_text=True)


def test_an_invitation_to_a_study_closed_since_says_so_and_works_once_it_is_open_again(
    ctx: Context, client: FlaskClient
) -> None:
    """Accepting it was refused with the coordinator's message ("make it active again") on the
    form, again on every try; now the link says at once that the study takes no one, uses
    nothing up, and works once the study is active again."""
    study_id, token = _invite(ctx, timedelta(hours=1))
    with ctx.session() as session:
        studies.set_status(session, studies.get_study(session, study_id), StudyStatus.CLOSED, None)
    page = client.get(f"/invite/{token}")
    # not gone (410, "Link no longer valid"): on hold until the study is active again
    assert page.status_code == 409
    text = page.get_data(as_text=True)
    assert "<h1>Study not open to new participants</h1>" in text
    assert "<title>Study not open to new participants · Baseline</title>" in text
    assert '<a href="/login">Log in</a>' in text  # the invited person has no account yet
    assert "which is closed and takes no new participants now" in text
    form = {"name": "Ada", "email": "ada@test.example", "password": PASSWORD}
    refused = client.post(f"/invite/{token}", data={**form, "csrf_token": _csrf(client, "/login")})
    assert refused.status_code == 409
    with ctx.session() as session:
        assert session.scalar(select(User).where(User.email == "ada@test.example")) is None
        studies.set_status(session, studies.get_study(session, study_id), StudyStatus.ACTIVE, None)
    accepted = client.post(
        f"/invite/{token}", data={**form, "csrf_token": _csrf(client, f"/invite/{token}")}
    )
    assert accepted.status_code == 302, accepted.get_data(as_text=True)
    with ctx.session() as session:
        user = session.scalar(select(User).where(User.email == "ada@test.example"))
        assert user is not None
        assert session.scalar(select(Participant).where(Participant.user_id == user.id))


def test_reused_invitation_is_refused(ctx: Context, app: Flask) -> None:
    _study_id, token = _invite(ctx, timedelta(hours=1))
    first = app.test_client()
    first.post(
        f"/invite/{token}",
        data={
            "name": "A",
            "email": "a@test.example",
            "password": PASSWORD,
            "csrf_token": _csrf(first, f"/invite/{token}"),
        },
    )
    second = app.test_client()
    page = second.get(f"/invite/{token}")
    assert page.status_code == 410
    assert "already been used" in page.get_data(as_text=True)
    with ctx.session() as session:
        assert session.scalar(select(func.count()).select_from(User)) == 1


def test_expired_invitation_is_refused(ctx: Context, client: FlaskClient) -> None:
    _study_id, token = _invite(ctx, timedelta(hours=1))
    with ctx.session() as session:
        invitation = session.scalar(select(Invitation))
        assert invitation is not None
        invitation.expires_at = utcnow() - timedelta(seconds=1)
    page = client.get(f"/invite/{token}")
    assert page.status_code == 410
    assert "<h1>Link no longer valid</h1>" in page.get_data(as_text=True)
    assert "expired" in page.get_data(as_text=True)
    response = client.post(
        f"/invite/{token}",
        data={"name": "Late", "email": "late@test.example", "password": PASSWORD},
    )
    assert response.status_code in (400, 410)
    with ctx.session() as session:
        assert session.scalar(select(User).where(User.email == "late@test.example")) is None


def test_unknown_invitation_is_refused(client: FlaskClient) -> None:
    page = client.get("/invite/not-a-real-token")
    assert page.status_code == 410
    assert "not valid" in page.get_data(as_text=True)


def test_invitation_bound_to_email(ctx: Context, client: FlaskClient) -> None:
    _study_id, token = _invite(ctx, timedelta(hours=1), email="bound@test.example")
    response = client.post(
        f"/invite/{token}",
        data={
            "name": "X",
            "email": "other@test.example",
            "password": PASSWORD,
            "csrf_token": _csrf(client, f"/invite/{token}"),
        },
    )
    assert response.status_code == 422
    assert "cannot be used with this invitation" in response.get_data(as_text=True)
    assert client.get(f"/invite/{token}").status_code == 200  # still usable by the right person


def test_api_token_lifecycle(ctx: Context, client: FlaskClient, users: Users) -> None:
    login(client, users[Role.GRADER].email)
    page = client.post(
        "/account",
        data={"action": "create", "name": "laptop", "csrf_token": _csrf(client, "/account")},
    )
    match = re.search(r'id="new-token">([^<]+)<', page.get_data(as_text=True))
    assert match
    secret = match.group(1)
    api = client.get("/api/v1/me", headers={"Authorization": f"Bearer {secret}"})
    assert api.status_code == 200 and json_of(api)["role"] == "grader"
    with ctx.session() as session:
        stored = session.scalars(select(accounts.ApiToken)).all()
        assert all(secret not in t.token_hash for t in stored)
        token_id = stored[0].id
    client.post(
        "/account",
        data={
            "action": "revoke",
            "token_id": str(token_id),
            "csrf_token": _csrf(client, "/account"),
        },
    )
    refused = client.get("/api/v1/me", headers={"Authorization": f"Bearer {secret}"})
    assert refused.status_code == 401
    assert json_of(refused)["error"] == "unauthorized"
