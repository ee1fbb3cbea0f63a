"""While the live demo runs, every page says how fast its clock runs, which workspace backend is
in use and what a real study needs instead; a participant of a demo without JupyterLab is told
why there is no workspace to open. Without the live demo, no page says any of it."""

from __future__ import annotations

import re

from flask import Flask
from flask.testing import FlaskClient

from app.factory import DEMO_NOTICE
from baseline.demo.live_demo import DOCKER, SANDBOX, demo_notice
from baseline.models import Role
from tests.conftest import Users, login

PAGES = {
    Role.ADMIN: ["/studies/", "/admin/", "/tasks/", "/analysis/"],
    Role.ANALYST: ["/studies/", "/analysis/"],
    Role.PARTICIPANT: ["/studies/", "/attempts/"],
}


def _banner(page: str) -> str:
    found = re.search(r'<div class="demo-banner" id="demo-banner">(.*?)</div>', page, re.S)
    assert found, "no demo banner on the page"
    return " ".join(found.group(1).split())


def test_every_page_shows_the_demo_clock_and_backend(app: Flask, users: Users) -> None:
    app.config[DEMO_NOTICE] = demo_notice(SANDBOX, jupyterlab=False)
    assert "Demo time: 1 working hour passes every 4 seconds." in _banner(
        app.test_client().get("/login").get_data(as_text=True)
    )
    for role, paths in PAGES.items():
        client = app.test_client()
        login(client, users[role].email)
        for path in paths:
            answer = client.get(path)
            assert answer.status_code == 200, path
            banner = _banner(answer.get_data(as_text=True))
            assert "Demo time: 1 working hour passes every 4 seconds." in banner, path
            assert "local sandbox backend (bubblewrap)" in banner
            assert "a real study needs Docker hosts" in banner
            assert "a real study connects a real model API" in banner
            jupyter = "Opening a workspace in JupyterLab needs the Docker backend"
            assert (jupyter in banner) is (role is Role.PARTICIPANT), path


def test_no_banner_without_the_live_demo_and_the_docker_demo_names_its_backend(
    app: Flask, client: FlaskClient, users: Users
) -> None:
    login(client, users[Role.PARTICIPANT].email)
    assert "demo-banner" not in client.get("/attempts/").get_data(as_text=True)
    app.config[DEMO_NOTICE] = demo_notice(DOCKER, jupyterlab=True)
    banner = _banner(client.get("/attempts/").get_data(as_text=True))
    assert "Demo time: 1 working hour passes every 4 seconds." in banner
    assert "local Docker Engine" in banner
    assert "JupyterLab" not in banner
