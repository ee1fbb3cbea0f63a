"""The holes found in the portal walkthrough, each closed and shown here: concurrent invitation
acceptance, login rate limit and account enumeration, server-side sessions, security headers."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select
from werkzeug.serving import make_server

from app import create_app
from baseline.context import Context
from baseline.models import AuditEvent, Invitation, Role, User
from baseline.people import accounts, logins
from baseline.studies import studies
from tests.app.chromium import chromium, console_errors, screenshot, serving
from tests.conftest import PASSWORD, Users, login


def _csrf_of(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


def _csrf(client: FlaskClient, path: str) -> str:
    return _csrf_of(client.get(path).get_data(as_text=True))


def _invitation(ctx: Context, email: str | None = None) -> str:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Invited"), None)
        _inv, token = accounts.create_invitation(
            session, Role.PARTICIPANT, timedelta(hours=1), None, study.id, email
        )
        return token


@pytest.fixture
def served(app: Flask) -> Iterator[str]:
    """The portal on a real threaded HTTP server, so requests really run at the same time."""
    with serving(app) as url:
        yield url


def test_concurrent_invitation_posts_create_one_account(ctx: Context, served: str) -> None:
    token = _invitation(ctx)
    url = f"{served}/invite/{token}"
    clients = 4
    barrier = threading.Barrier(clients)
    statuses: list[int] = []

    def accept(n: int) -> None:
        with requests.Session() as http:
            csrf = _csrf_of(http.get(url, timeout=30).text)
            barrier.wait()
            response = http.post(
                url,
                data={
                    "email": f"racer{n}@test.example",
                    "name": f"Racer {n}",
                    "password": PASSWORD,
                    "csrf_token": csrf,
                },
                allow_redirects=False,
                timeout=60,
            )
            statuses.append(response.status_code)

    threads = [threading.Thread(target=accept, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(statuses) == [302, 410, 410, 410], statuses
    with ctx.session() as session:
        assert session.scalar(select(func.count(User.id))) == 1
        accepted = session.scalar(
            select(func.count(AuditEvent.id)).where(AuditEvent.action == "invitation.accept")
        )
        assert accepted == 1
        assert session.scalar(select(Invitation.used_by_id)) is not None


def _post_login(client: FlaskClient, email: str, password: str) -> int:
    response = client.post(
        "/login",
        data={"email": email, "password": password, "csrf_token": _csrf(client, "/login")},
    )
    return response.status_code


def test_account_locks_after_repeated_failures(client: FlaskClient, users: Users) -> None:
    email = users[Role.ADMIN].email
    for _ in range(logins.MAX_FAILURES_PER_EMAIL):
        assert _post_login(client, email, "wrong-password") == 401
    response = client.post(
        "/login",
        data={"email": email, "password": PASSWORD, "csrf_token": _csrf(client, "/login")},
    )
    assert response.status_code == 429
    assert "Too many failed attempts" in response.get_data(as_text=True)


def test_unknown_email_locks_like_a_known_one(client: FlaskClient, users: Users) -> None:
    """The lock-out is per e-mail as typed: it does not tell whether an account exists."""
    for _ in range(logins.MAX_FAILURES_PER_EMAIL):
        assert _post_login(client, "nobody@test.example", "wrong-password") == 401
    assert _post_login(client, "nobody@test.example", "wrong-password") == 429


def test_client_is_limited_across_emails(client: FlaskClient, users: Users) -> None:
    for n in range(logins.MAX_FAILURES_PER_CLIENT):
        assert _post_login(client, f"guess{n}@test.example", "wrong-password") == 401
    assert _post_login(client, users[Role.ANALYST].email, PASSWORD) == 429


def test_lockout_holds_across_portal_processes(ctx: Context, users: Users) -> None:
    """Two app instances on one database (as two server processes): failures in one count in
    the other, because they are stored in the database."""
    first = create_app(context=ctx).test_client()
    second = create_app(context=ctx).test_client()
    email = users[Role.COORDINATOR].email
    for _ in range(logins.MAX_FAILURES_PER_EMAIL):
        assert _post_login(first, email, "wrong-password") == 401
    assert _post_login(second, email, PASSWORD) == 429


def test_successful_login_forgives_earlier_failures(client: FlaskClient, users: Users) -> None:
    email = users[Role.GRADER].email
    for _ in range(logins.MAX_FAILURES_PER_EMAIL - 1):
        assert _post_login(client, email, "wrong-password") == 401
    assert _post_login(client, email, PASSWORD) == 302
    client.post("/logout", data={"csrf_token": _csrf(client, "/account")})
    assert _post_login(client, email, "wrong-password") == 401
    assert _post_login(client, email, PASSWORD) == 302


def test_unknown_email_costs_a_password_verification(
    ctx: Context, users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Equal work for known and unknown e-mails: both verify one argon2 hash."""
    real = accounts._hasher
    calls: list[str] = []

    class Counting:
        def verify(self, password_hash: str, password: str) -> bool:
            calls.append(password_hash)
            return real.verify(password_hash, password)

        def hash(self, password: str) -> str:
            return real.hash(password)

    monkeypatch.setattr(accounts, "_hasher", Counting())
    with ctx.session() as session:
        assert accounts.authenticate(session, users[Role.ADMIN].email, "wrong-pass") is None
        assert accounts.authenticate(session, "nobody@test.example", "wrong-pass") is None
    assert len(calls) == 2


def test_invitation_form_does_not_reveal_existing_email(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    token = _invitation(ctx)
    answers = []
    for email in (users[Role.ADMIN].email, "fresh@test.example"):
        answers.append(
            client.post(
                f"/invite/{token}",
                data={
                    "email": email,
                    "name": "Probe",
                    "password": "short",  # invalid: neither attempt creates an account
                    "csrf_token": _csrf(client, f"/invite/{token}"),
                },
            )
        )
    bodies = [a.get_data(as_text=True) for a in answers]
    assert [a.status_code for a in answers] == [422, 422]
    taken = client.post(
        f"/invite/{token}",
        data={
            "email": users[Role.ADMIN].email,
            "name": "Probe",
            "password": PASSWORD,
            "csrf_token": _csrf(client, f"/invite/{token}"),
        },
    )
    text = taken.get_data(as_text=True)
    assert taken.status_code == 422
    assert "exists" not in text and users[Role.ADMIN].email not in text
    assert accounts.UNUSABLE_EMAIL.split(".")[0] in text
    assert "exists" not in bodies[0]


def _copy_cookie(source: FlaskClient, target: FlaskClient) -> None:
    cookie = source.get_cookie("session")
    assert cookie is not None
    target.set_cookie("session", cookie.value)


def test_copied_session_cookie_dies_on_logout(app: Flask, users: Users) -> None:
    browser, thief = app.test_client(), app.test_client()
    login(browser, users[Role.COORDINATOR].email)
    _copy_cookie(browser, thief)
    assert thief.get("/studies/").status_code == 200
    browser.post("/logout", data={"csrf_token": _csrf(browser, "/studies/")})
    assert thief.get("/studies/").status_code == 302
    assert "user_id" not in str(browser.get_cookie("session"))


def test_password_change_ends_every_other_session(app: Flask, users: Users) -> None:
    browser, other = app.test_client(), app.test_client()
    email = users[Role.ANALYST].email
    login(browser, email)
    login(other, email)
    response = browser.post(
        "/account",
        data={
            "action": "password",
            "current_password": PASSWORD,
            "new_password": "a new long password",
            "new_password_again": "a new long password",
            "csrf_token": _csrf(browser, "/account"),
        },
    )
    assert response.status_code == 303
    assert browser.get("/account").status_code == 200  # this browser stays logged in
    assert other.get("/account").status_code == 302
    assert _post_login(app.test_client(), email, PASSWORD) == 401
    assert _post_login(app.test_client(), email, "a new long password") == 302


def test_password_change_needs_the_current_password(client: FlaskClient, users: Users) -> None:
    login(client, users[Role.GRADER].email)
    response = client.post(
        "/account",
        data={
            "action": "password",
            "current_password": "not-the-password",
            "new_password": "a new long password",
            "new_password_again": "a new long password",
            "csrf_token": _csrf(client, "/account"),
        },
        follow_redirects=True,
    )
    assert "current password is wrong" in response.get_data(as_text=True)
    assert _post_login(client, users[Role.GRADER].email, PASSWORD) == 302


def test_deactivation_and_admin_reset_end_sessions(app: Flask, users: Users) -> None:
    admin, victim, other = app.test_client(), app.test_client(), app.test_client()
    login(admin, users[Role.ADMIN].email)
    login(victim, users[Role.PARTICIPANT].email)
    login(other, users[Role.GRADER].email)
    reset = admin.post(
        f"/admin/users/{users[Role.GRADER].id}/password",
        data={"password": "reset by admin 1", "csrf_token": _csrf(admin, "/admin/")},
    )
    assert reset.status_code == 303
    assert other.get("/account").status_code == 302
    assert _post_login(app.test_client(), users[Role.GRADER].email, "reset by admin 1") == 302

    admin.post(
        f"/admin/users/{users[Role.PARTICIPANT].id}/active",
        data={"active": "0", "csrf_token": _csrf(admin, "/admin/")},
    )
    admin.post(
        f"/admin/users/{users[Role.PARTICIPANT].id}/active",
        data={"active": "1", "csrf_token": _csrf(admin, "/admin/")},
    )
    assert victim.get("/account").status_code == 302  # reactivation does not revive it


TEMPLATES = Path(__file__).resolve().parents[2] / "app" / "templates"


def test_templates_need_no_inline_script() -> None:
    """The CSP forbids inline script, so no template may carry any (JSON data blocks are not
    script, and are allowed)."""
    offenders = []
    for template in sorted(TEMPLATES.rglob("*.html")):
        text = template.read_text()
        for match in re.finditer(r"<script(?P<attrs>[^>]*)>", text):
            attrs = match.group("attrs")
            if "src=" not in attrs and 'type="application/json"' not in attrs:
                offenders.append(f"{template.name}: inline <script>")
        if re.search(r"\son[a-z]+\s*=", text) or "javascript:" in text:
            offenders.append(f"{template.name}: event-handler attribute or javascript: URL")
    assert offenders == []


HUB_ORIGIN = "http://127.0.0.1:8010"  # the hub's default public URL (baseline.hub_settings)


def test_every_page_carries_the_security_headers(client: FlaskClient, users: Users) -> None:
    login(client, users[Role.ADMIN].email)
    for path in ("/login", "/studies/", "/admin/", "/api/v1/health", "/no-such-page"):
        response = client.get(path)
        csp = response.headers.get("Content-Security-Policy", "")
        script_src = re.search(r"script-src ([^;]*)", csp)
        assert script_src and "'unsafe-inline'" not in script_src.group(1), path
        assert "frame-ancestors 'none'" in csp, path
        assert response.headers.get("X-Frame-Options") == "DENY", path
        assert response.headers.get("X-Content-Type-Options") == "nosniff", path
        assert response.headers.get("Referrer-Policy") == "same-origin", path
        # Forms post to this origin; "Open workspace" and logout redirect on to the hub only.
        form_action = re.search(r"form-action ([^;]*)", csp)
        assert form_action and form_action.group(1).split() == ["'self'", HUB_ORIGIN], path


def test_swagger_ui_assets_are_served_from_the_portal(client: FlaskClient) -> None:
    page = client.get("/api/v1/docs")
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and all(a.startswith("/") and not a.startswith("//") for a in assets), assets
    for asset in assets:
        response = client.get(asset)
        assert response.status_code == 200, asset
        assert len(response.data) > 100, asset
    csp = page.headers["Content-Security-Policy"]
    assert "'sha256-" in csp  # exactly the page's own inline script, nothing else
    assert "cdn" not in html


def test_favicon_answers(client: FlaskClient) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response.data[:4] == b"\x00\x00\x01\x00"  # an ICO file


@pytest.mark.browser
@pytest.mark.sqlite_only("the Content-Security-Policy in a browser, not the storage")
def test_swagger_ui_runs_under_the_csp_in_chromium(app: Flask) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with chromium() as driver:
            driver.get(f"http://127.0.0.1:{server.server_port}/api/v1/docs")
            WebDriverWait(driver, 60).until(
                ec.presence_of_element_located((By.CSS_SELECTOR, ".swagger-ui .opblock"))
            )
            title = driver.find_element(By.CSS_SELECTOR, ".swagger-ui .info .title").text
            screenshot(driver, "api-docs")
            errors = console_errors(driver)
    finally:
        server.shutdown()
        thread.join(timeout=10)
    assert "Baseline API" in title
    assert errors == []
