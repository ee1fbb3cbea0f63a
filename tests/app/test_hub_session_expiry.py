"""A hub login lasts no longer than the portal session behind it: the hub's authenticator, at its
auth refresh age, asks the portal (`/hub-service/session`) and refuses a login whose portal
session expired or was revoked without a logout. Here the real authenticator asks the real portal
served on a port; that JupyterHub calls `refresh_user` at `auth_refresh_age`, and refuses a stale
login on token checks under `auth_refresh_strict`, is JupyterHub's documented behaviour.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import update

from baseline.config import Settings
from baseline.context import Context
from baseline.hub_settings import hub_config
from baseline.models import User, UserSession, utcnow
from baseline.people import logins
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
