"""The hosts admin page: admins only; add a host, check it against the real dockerd."""

from __future__ import annotations

import re

import pytest
from flask.testing import FlaskClient

from baseline.context import Context
from baseline.models import Host, Role
from tests.conftest import Users, login
from tests.docker_env import LOCAL_URL, docker_url


def _csrf(client: FlaskClient) -> str:
    page = client.get("/admin/hosts/").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token
    return token.group(1)


def test_only_admins_see_hosts(client: FlaskClient, users: Users) -> None:
    login(client, users[Role.COORDINATOR].email)
    assert client.get("/admin/hosts/").status_code == 403


@pytest.mark.docker
def test_admin_adds_and_checks_a_host(client: FlaskClient, users: Users, ctx: Context) -> None:
    docker_url("unix")
    login(client, users[Role.ADMIN].email)
    token = _csrf(client)
    bad = client.post(
        "/admin/hosts/",
        data={"name": "x", "docker_url": "http://nope", "csrf_token": token},
        follow_redirects=True,
    )
    assert "must start with unix:// or ssh://" in bad.get_data(as_text=True)
    client.post(
        "/admin/hosts/", data={"name": "here", "docker_url": LOCAL_URL, "csrf_token": token}
    )
    page = client.get("/admin/hosts/").get_data(as_text=True)
    assert "here" in page and "never" in page
    checked = client.post(
        "/admin/hosts/check", data={"name": "here", "csrf_token": token}, follow_redirects=True
    ).get_data(as_text=True)
    assert "here is healthy" in checked
    with ctx.session() as session:
        host = session.query(Host).filter_by(name="here").one()
        assert host.healthy and host.last_checked_at is not None
    missing = client.post(
        "/admin/hosts/check", data={"name": "ghost", "csrf_token": token}, follow_redirects=True
    ).get_data(as_text=True)
    assert "no host named ghost" in missing
