"""A hub login lasts no longer than the portal session behind it: the hub's authenticator, at its
auth refresh age, asks the portal (`/hub-service/session`) and refuses a login whose portal
session expired or was revoked without a logout. Here the real authenticator asks the real portal
served on a port; that JupyterHub calls `refresh_user` at `auth_refresh_age`, and refuses a stale
login on token checks under `auth_refresh_strict`, is JupyterHub's documented behaviour, and the
per-browser tests run it through JupyterHub's own `BaseHandler.refresh_auth`.

The login is bound to the portal session that made it, in the browser that made it: one browser's
portal session ending ends the hub login there, not the same person's login in another browser.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from flask import Flask
from flask.testing import FlaskClient
from jupyterhub.handlers.base import BaseHandler
from sqlalchemy import update
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from app.blueprints import hub as hub_blueprint
from app.blueprints.participant import WORK_ENTRY
from baseline.config import Settings
from baseline.context import Context
from baseline.hub_settings import hub_config
from baseline.models import User, UserSession, utcnow
from baseline.people import logins
from baseline.tokens import hash_secret
from infra.hub.authenticator import PortalAuthenticator
from tests.app.chromium import serving
from tests.baseline.attempt_world import started_human_attempt

pytestmark = pytest.mark.sqlite_only


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    home = tmp_path / "home"
    home.mkdir()
    return Settings(home=home, database_url=database_url, secret_key="s")


def _refresh(portal_url: str, token: str, hub_user: str) -> bool:
    authenticator = PortalAuthenticator(portal_url=portal_url, service_token=token)
    return bool(asyncio.run(authenticator.refresh_user(SimpleNamespace(name=hub_user))))


def _person(ctx: Context, tmp_path: Path) -> int:
    human = started_human_attempt(ctx, tmp_path, docker_url="unix:///var/run/docker.sock")
    return human.user_id


def test_an_expired_portal_session_ends_the_hub_login(
    ctx: Context, app: Flask, tmp_path: Path
) -> None:
    user_id = _person(ctx, tmp_path)
    token = hub_config(ctx.settings).service_token()
    with ctx.session() as session:
        user = session.get(User, user_id)
        assert user is not None
        logins.open_session(session, user)
    with serving(app) as url:
        assert _refresh(url, token, f"u{user_id}")  # the portal session lives: the login stands
        with ctx.session() as session:  # 12 hours on, no logout: the session has expired
            session.execute(update(UserSession).values(expires_at=utcnow() - timedelta(seconds=1)))
        assert not _refresh(url, token, f"u{user_id}")
        assert not _refresh(url, "not-the-service-token", f"u{user_id}")
    # The portal down: not an expired session (the next refresh asks again).
    assert _refresh(url, token, f"u{user_id}")


@pytest.mark.parametrize("ending", ["revoked", "deactivated"])
def test_a_revoked_session_or_deactivated_account_ends_it(
    ctx: Context, app: Flask, tmp_path: Path, ending: str
) -> None:
    user_id = _person(ctx, tmp_path)
    token = hub_config(ctx.settings).service_token()
    with ctx.session() as session:
        user = session.get(User, user_id)
        assert user is not None
        logins.open_session(session, user)
        if ending == "revoked":
            logins.end_all_sessions(session, user_id)
        else:
            user.active = False
    with serving(app) as url:
        assert not _refresh(url, token, f"u{user_id}")


def test_the_session_route_answers_only_the_hub(ctx: Context, client: FlaskClient) -> None:
    token = hub_config(ctx.settings).service_token()
    assert client.get("/hub-service/session?user=u1").status_code == 403
    bad = client.get("/hub-service/session?user=x1", headers={"Authorization": f"Bearer {token}"})
    assert bad.status_code == 404 and "not a portal user" in bad.get_json()["message"]
    nobody = client.get(
        "/hub-service/session?user=u999", headers={"Authorization": f"Bearer {token}"}
    )
    assert nobody.status_code == 200 and nobody.get_json() == {"live": False}


def test_stale_logins_are_refused_on_token_checks_too() -> None:
    """JupyterLab's requests reach the hub as the server's token checks: a stale login must be
    refused there as well, or the Lab outlives the portal session."""
    assert PortalAuthenticator().auth_refresh_strict is True


class _HubRequest(BaseHandler):
    """A request reaching the hub from one browser (its ``jupyterhub-session-id`` cookie and, for
    a login, the ``login_token``), or, with `token_check`, a single-user server's check of the
    OAuth token that browser holds. Built without a running hub: JupyterHub's own methods read it.
    """

    def __init__(
        self,
        authenticator: PortalAuthenticator,
        user: Any,
        hub_session: str,
        *,
        login_token: str = "",
        token_check: bool = False,
    ) -> None:
        headers = HTTPHeaders({"Host": "hub.test"})
        if not token_check:  # a server's token check comes from the server, without cookies
            headers["Cookie"] = f"jupyterhub-session-id={hub_session}"
        query = f"?login_token={login_token}" if login_token else ""
        self.request = HTTPServerRequest(
            start_line=RequestStartLine("GET", f"/hub/login{query}", "HTTP/1.1"),
            headers=headers,
        )
        self.application = SimpleNamespace(settings={"authenticator": authenticator})
        self._jupyterhub_user = user
        self._token_authenticated = token_check
        self._oauth_session = hub_session

    def get_token(self) -> Any:
        return (
            SimpleNamespace(session_id=self._oauth_session) if self._token_authenticated else None
        )


@dataclass
class TwoBrowsers:
    portal_url: str
    service_token: str
    user_id: int
    attempt_id: int
    a: FlaskClient
    b: FlaskClient


@contextmanager
def _two_browsers(
    ctx: Context, app: Flask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TwoBrowsers]:
    """The portal served on a port, a participant with a running workspace, and two browsers
    (test clients) each logged into the portal with a session of its own."""
    monkeypatch.setattr(hub_blueprint, "hub_is_up", lambda _url: True)
    human = started_human_attempt(
        ctx, tmp_path, docker_url="unix:///var/run/docker.sock", consented=True
    )
    a, b = app.test_client(), app.test_client()
    for browser in (a, b):
        _portal_login(ctx, browser, human.user_id)
    with serving(app) as url:
        token = hub_config(ctx.settings).service_token()
        yield TwoBrowsers(url, token, human.user_id, human.attempt_id, a, b)


def _portal_login(ctx: Context, browser: FlaskClient, user_id: int) -> None:
    with ctx.session() as session:
        user = session.get(User, user_id)
        assert user is not None
        secret = logins.open_session(session, user)
    with browser.session_transaction() as cookie:
        cookie["sid"] = secret


def _open_workspace(browser: FlaskClient, attempt_id: int) -> str:
    """ "Open workspace" in this browser: the one-time login token it carries to the hub."""
    page = browser.get(f"/attempts/{attempt_id}").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf
    opened = browser.post(f"/attempts/{attempt_id}/workspace", data={"csrf_token": csrf.group(1)})
    assert opened.status_code == 302, opened.get_data(as_text=True)
    with browser.session_transaction() as cookie:
        login_url = cookie[WORK_ENTRY]["url"]
    return parse_qs(urlsplit(login_url).query)["login_token"][0]


def _hub_login(
    world: TwoBrowsers, authenticator: PortalAuthenticator, browser: FlaskClient, hub_session: str
) -> Any:
    """The hub's ``/hub/login`` in this browser, with the token "Open workspace" gave it: the
    hub user, as JupyterHub keeps it (one object for all the user's browsers)."""
    login_token = _open_workspace(browser, world.attempt_id)
    request = _HubRequest(authenticator, None, hub_session, login_token=login_token)
    made = asyncio.run(authenticator.authenticate(request))
    assert made == {"name": f"u{world.user_id}"}
    return SimpleNamespace(name=made["name"], _auth_refreshed=time.monotonic())


def _stands(
    authenticator: PortalAuthenticator, user: Any, hub_session: str, *, token_check: bool = False
) -> bool:
    """Whether the hub lets this browser's request in (JupyterHub's own refresh decides)."""
    request = _HubRequest(authenticator, user, hub_session, token_check=token_check)
    return asyncio.run(request.refresh_auth(user)) is user


def _expire(ctx: Context, browser: FlaskClient) -> None:
    """This browser's portal session expires (12 hours on, no logout); the other's lives."""
    with browser.session_transaction() as cookie:
        secret = cookie["sid"]
    with ctx.session() as session:
        session.execute(
            update(UserSession)
            .where(UserSession.token_hash == hash_secret(secret))
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )


def _seconds_pass(user: Any, seconds: float) -> None:
    # As JupyterHub's own tests let time pass for its per-user refresh clock.
    user._auth_refreshed -= seconds


def test_one_browsers_portal_session_ending_ends_the_hub_login_there_only(
    ctx: Context, app: Flask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The participant works in browser A and browser B, each logged into the portal. A's portal
    session expires: two seconds on, A's hub pages and A's JupyterLab (its token check) are
    refused, while B, which keeps working meanwhile, is not; nor does B's fresh refresh vouch
    for A (JupyterHub keeps its refresh time per user)."""
    with _two_browsers(ctx, app, tmp_path, monkeypatch) as world:
        hub = PortalAuthenticator(portal_url=world.portal_url, service_token=world.service_token)
        user = _hub_login(world, hub, world.a, "hub-a")
        _hub_login(world, hub, world.b, "hub-b")
        _expire(ctx, world.a)
        _seconds_pass(user, 2)
        assert _stands(hub, user, "hub-b")  # B's request, refreshed
        _seconds_pass(user, 2)
        assert not _stands(hub, user, "hub-a")
        assert not _stands(hub, user, "hub-a", token_check=True)
        assert _stands(hub, user, "hub-b") and _stands(hub, user, "hub-b", token_check=True)
        # A hub login that no portal session made (one from before logins were bound) is
        # refused too: that browser opens the workspace from the portal again.
        _seconds_pass(user, 2)
        assert not _stands(hub, user, "hub-from-an-older-login")


def test_a_revoked_session_ends_its_login_and_a_new_portal_login_makes_one_that_stands(
    ctx: Context, app: Flask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Browser A's portal session is revoked (B's lives): A's hub login ends. A logs into the
    portal again and opens the workspace: the new hub login, same browser, stands."""
    with _two_browsers(ctx, app, tmp_path, monkeypatch) as world:
        hub = PortalAuthenticator(portal_url=world.portal_url, service_token=world.service_token)
        user = _hub_login(world, hub, world.a, "hub-a")
        _hub_login(world, hub, world.b, "hub-b")
        with world.a.session_transaction() as cookie, ctx.session() as session:
            logins.end_session(session, cookie["sid"])
        _seconds_pass(user, 2)
        assert not _stands(hub, user, "hub-a")
        _portal_login(ctx, world.a, world.user_id)
        user = _hub_login(world, hub, world.a, "hub-a")
        _seconds_pass(user, 2)
        assert _stands(hub, user, "hub-a") and _stands(hub, user, "hub-b")


def test_a_browsers_live_answer_is_kept_for_the_check_age(
    ctx: Context, app: Flask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The portal is asked about a browser's login once per `session_check_age`, not at every
    request: within it, a live answer stands; past it, the portal is asked again."""
    with _two_browsers(ctx, app, tmp_path, monkeypatch) as world:
        hub = PortalAuthenticator(
            portal_url=world.portal_url, service_token=world.service_token, session_check_age=60
        )
        user = _hub_login(world, hub, world.a, "hub-a")
        _seconds_pass(user, 2)
        assert _stands(hub, user, "hub-a")
        _expire(ctx, world.a)
        _seconds_pass(user, 2)
        assert _stands(hub, user, "hub-a")  # asked 2 seconds ago
        monkeypatch.setattr(time, "monotonic", lambda real=time.monotonic: real() + 61)
        assert not _stands(hub, user, "hub-a")
