"""Every route x every role: the access-control matrix.

Each view declares its roles with `@requires`; this test checks that every route does declare
them, that anonymous users reach only the login and invitation pages, and then calls every route
as every role (and anonymously) and checks the answer: allowed roles are served, the others are
refused (403; anonymous: redirect to login, or 401 on the API). CSRF is disabled here so that the
role check itself is what refuses a POST; tests/app/test_csrf.py covers CSRF.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from flask import Flask
from werkzeug.routing import Rule

from app.access import PUBLIC
from baseline.context import Context
from baseline.models import (
    Attempt,
    Grading,
    GradingKind,
    Reproduction,
    Role,
    Task,
    TaskKind,
    User,
)
from baseline.people import accounts
from baseline.studies import studies
from tests.baseline.attempt_world import blobless_final_snapshot
from tests.conftest import PASSWORD, Users, json_of, login

# Routes that are not views of ours: static files and the generated API document.
FRAMEWORK_ENDPOINTS = {
    "static",
    "openapi.spec",
    "openapi.docs",
    "openapi.swagger_ui_oauth_redirect",
    "swagger_ui.static",
}
# Everything an anonymous visitor may reach.
PUBLIC_ENDPOINTS = {
    "auth.home",
    "auth.login",
    "auth.logout",
    "auth.invitation",
    "api.health",
    "security.favicon",
}
# The hub's calls to the portal: no portal session, authenticated by the hub's service token
# (tests/app/test_hub_service.py and test_hub_session_expiry.py show that they refuse everyone
# else).
PUBLIC_ENDPOINTS |= {"hub.redeem", "hub.server", "hub.session_live"}


@dataclass
class World:
    study_id: int
    task_id: int
    own_attempt_id: int
    other_attempt_id: int
    other_participant: User
    invitation_token: str
    snapshot_id: int
    reproduction_id: int
    grading_id: int

    def path_values(self, rule: Rule) -> dict[str, object]:
        known: dict[str, object] = {
            "study_id": self.study_id,
            "task_id": self.task_id,
            "attempt_id": self.own_attempt_id,
            "user_id": self.other_participant.id,
            "token": self.invitation_token,
            "filename": "baseline.css",
            "snapshot_id": self.snapshot_id,
            "reproduction_id": self.reproduction_id,
            "grading_id": self.grading_id,
            "alert_id": 1,  # none exists: an allowed role gets 404
            "fmt": "csv",
            "name": "trajectories",
            "path": "paper.md",
        }
        missing = set(rule.arguments) - set(known)
        assert not missing, f"{rule.rule}: add a value for {sorted(missing)} to the matrix"
        return {name: known[name] for name in rule.arguments}


@pytest.fixture
def world(ctx: Context, users: Users) -> World:
    with ctx.session() as session:
        admin = session.merge(users[Role.ADMIN])
        me = session.merge(users[Role.PARTICIPANT])
        other = accounts.create_user(
            session, "other@test.example", "Other", PASSWORD, Role.PARTICIPANT
        )
        study = studies.create_study(session, studies.StudySpec(name="Matrix study"), admin.id)
        task = Task(
            slug="matrix-task", title="Matrix task", kind=TaskKind.PAPER, content_hash="0" * 64
        )
        session.add(task)
        session.flush()
        studies.add_task(session, study, task, admin.id)
        session.flush()
        session.refresh(study)
        mine = studies.enroll_human(session, study.id, me, admin.id)
        theirs = studies.enroll_human(session, study.id, other, admin.id)
        own = studies.create_attempt(session, mine, task, admin.id)
        foreign = studies.create_attempt(session, theirs, task, admin.id)
        _inv, token = accounts.create_invitation(
            session, Role.PARTICIPANT, timedelta(hours=1), admin.id, study.id
        )
        # A snapshot whose blobs are absent: every route reading it must answer 4xx, not 500.
        snapshot = blobless_final_snapshot(session, own.id)
        reproduction = Reproduction(snapshot_id=snapshot.id, details={})
        grading = Grading(snapshot_id=snapshot.id, kind=GradingKind.JUDGE, config={})
        session.add_all([reproduction, grading])
        session.flush()
        return World(
            study.id,
            task.id,
            own.id,
            foreign.id,
            other,
            token,
            snapshot.id,
            reproduction.id,
            grading.id,
        )


@pytest.fixture
def matrix_app(app: Flask) -> Flask:
    app.config["WTF_CSRF_ENABLED"] = False
    return app


def _rules(app: Flask) -> list[Rule]:
    return [r for r in app.url_map.iter_rules() if r.endpoint not in FRAMEWORK_ENDPOINTS]


def test_every_route_declares_its_roles(matrix_app: Flask) -> None:
    undeclared = [
        rule.rule
        for rule in _rules(matrix_app)
        if not hasattr(matrix_app.view_functions[rule.endpoint], "allowed_roles")
    ]
    assert undeclared == []


def test_anonymous_reaches_only_login_and_invitation(matrix_app: Flask) -> None:
    public = {
        rule.endpoint
        for rule in _rules(matrix_app)
        if PUBLIC in matrix_app.view_functions[rule.endpoint].allowed_roles  # type: ignore[union-attr]
    }
    assert public == PUBLIC_ENDPOINTS


def _expected_refusal(path: str, anonymous: bool) -> set[int]:
    if anonymous:
        return {401} if path.startswith("/api/") else {302}
    return {403}


@pytest.mark.parametrize("role", [None, *Role], ids=lambda r: "anonymous" if r is None else r.value)
def test_matrix(matrix_app: Flask, users: Users, world: World, role: Role | None) -> None:
    failures: list[str] = []
    client = matrix_app.test_client()
    headers: dict[str, str] = {}
    if role is not None:
        login(client, users[role].email)
        with matrix_app.extensions["baseline"].session() as session:
            token = accounts.issue_token(session, session.merge(users[role]), "matrix")
        headers["Authorization"] = f"Bearer {token}"
    for rule in _rules(matrix_app):
        allowed = matrix_app.view_functions[rule.endpoint].allowed_roles  # type: ignore[union-attr]
        if rule.endpoint == "auth.logout":
            continue  # logging out would end this client's session; covered in test_auth
        with matrix_app.test_request_context():
            path = matrix_app.url_for(rule.endpoint, **world.path_values(rule))  # type: ignore[arg-type]
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            response = client.open(
                path,
                method=method,
                headers=headers,
                json={} if path.startswith("/api/") and method != "GET" else None,
            )
            status = response.status_code
            label = f"{method} {path} as {role.value if role else 'anonymous'}: {status}"
            if status >= 500:
                failures.append(label + " (server error)")
            elif PUBLIC in allowed:
                continue
            elif role is not None and role in allowed:
                if status in (401, 403):
                    failures.append(label + " (should be allowed)")
            elif status not in _expected_refusal(path, role is None):
                failures.append(label + " (should be refused)")
    assert failures == []


def test_participant_never_sees_another_participants_attempt(
    matrix_app: Flask, users: Users, world: World
) -> None:
    with matrix_app.extensions["baseline"].session() as session:
        token = accounts.issue_token(session, session.merge(users[Role.PARTICIPANT]), "t")
    client = matrix_app.test_client()
    auth = {"Authorization": f"Bearer {token}"}
    listed = json_of(client.get("/api/v1/attempts", headers=auth))["attempts"]
    assert [a["id"] for a in listed] == [world.own_attempt_id]
    assert client.get(f"/api/v1/attempts/{world.own_attempt_id}", headers=auth).status_code == 200
    foreign = client.get(f"/api/v1/attempts/{world.other_attempt_id}", headers=auth)
    assert foreign.status_code == 404
    assert json_of(foreign)["error"] == "not_found"

    login(client, users[Role.PARTICIPANT].email)
    page = client.get(f"/studies/{world.study_id}").get_data(as_text=True)
    assert f'/attempts/{world.other_attempt_id}"' not in page
    assert f'/attempts/{world.own_attempt_id}"' in page
    assert "Other" not in page  # no other participant's name


def test_participant_sees_only_enrolled_studies(
    ctx: Context, matrix_app: Flask, users: Users, world: World
) -> None:
    with ctx.session() as session:
        hidden = studies.create_study(session, studies.StudySpec(name="Not yours"), None)
        hidden_id = hidden.id
    client = matrix_app.test_client()
    login(client, users[Role.PARTICIPANT].email)
    assert "Not yours" not in client.get("/studies/").get_data(as_text=True)
    assert client.get(f"/studies/{hidden_id}").status_code == 404
    assert client.get(f"/studies/{world.study_id}").status_code == 200
    with ctx.session() as session:
        assert session.get(Attempt, world.own_attempt_id) is not None
