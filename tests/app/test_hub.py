"""JupyterHub end to end: the real portal, hub, proxy and Docker workspaces (no stand-ins).

A participant logs into the portal, "Open workspace" carries a one-time token to the hub, the hub
spawns JupyterLab inside the attempt's existing container (egress `none`: no network, so every
byte goes through the spawner's docker-exec tunnel), a file written through the single-user
server's API is in the next snapshot, and the clock started at that login. Another participant's
server, spawn and hub API routes are refused; a used login token is refused; a hub restart keeps
the server and its route.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import requests
from flask import Flask

from baseline.config import Settings
from baseline.context import Context
from baseline.models import PauseReason
from tests.docker_env import docker_url, test_image
from tests.hub_world import HubWorld, Participant, hub_extra, require_jupyter_image

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["test_image"]


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite only: the hub's path does not depend on the database engine, and this is slow."""
    return f"sqlite:///{tmp_path / 'test.db'}"


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    home = tmp_path / "home"
    home.mkdir()
    return Settings(home=home, database_url=database_url, secret_key="hub", extra=hub_extra())


@pytest.fixture
def world(ctx: Context, app: Flask, test_image: str) -> Iterator[HubWorld]:
    docker_url("unix")
    require_jupyter_image(test_image)
    hub_world = HubWorld(ctx=ctx, app=app, image=test_image, home=ctx.settings.home)
    try:
        hub_world.start_portal()
        hub_world.start_hub()
        yield hub_world
    finally:
        hub_world.close()


def _login_and_open(world: HubWorld, who: Participant) -> requests.Session:
    browser = world.portal_login(who)
    landed = world.open_workspace(browser, who)
    assert landed.status_code == 200, landed.text[-2000:]
    world.wait_ready(who)
    return browser


def _lab(world: HubWorld, browser: requests.Session, who: Participant) -> requests.Response:
    return browser.get(world.hub_url(f"/user/{who.hub_user}/{who.server}/lab"), timeout=60)


def _put_file(
    world: HubWorld, browser: requests.Session, who: Participant, name: str, text: str
) -> requests.Response:
    xsrf = browser.cookies.get("_xsrf", path=f"/user/{who.hub_user}/{who.server}/") or ""
    return browser.put(
        world.hub_url(f"/user/{who.hub_user}/{who.server}/api/contents/{name}"),
        json={"type": "file", "format": "text", "content": text},
        headers={"X-XSRFToken": xsrf},
        timeout=60,
    )


def test_participant_works_in_own_workspace_through_the_hub(world: HubWorld) -> None:
    world.add_participants(2)
    me, other = world.participants
    browser = world.portal_login(me)

    # The portal's redirect carries a one-time token and the spawn path of my own attempt.
    page = browser.get(f"{world.portal_url}/attempts/{me.attempt_id}").text
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf
    first = browser.post(
        f"{world.portal_url}/attempts/{me.attempt_id}/workspace",
        data={"csrf_token": csrf.group(1)},
        allow_redirects=False,
    )
    assert first.status_code == 302
    target = urlparse(first.headers["Location"])
    query = parse_qs(target.query)
    assert target.path == "/hub/login"
    assert query["next"] == [f"/hub/spawn/{me.hub_user}/{me.server}"]
    login_url = first.headers["Location"]
    landed = browser.get(login_url, timeout=120)
    assert landed.status_code == 200, landed.text[-2000:]
    server = world.wait_ready(me)
    assert server["name"] == me.server

    # The clock started at this hub login, not before.
    attempt = world.attempt(me)
    assert attempt.first_login_at is not None
    not_started = [p for p in attempt.pauses if p.reason is PauseReason.NOT_STARTED]
    assert len(not_started) == 1 and not_started[0].ended_at == attempt.first_login_at
    assert attempt.status.value == "running"

    # The same login token is worth nothing a second time (in a fresh browser).
    replay = requests.get(login_url, timeout=30, allow_redirects=False)
    assert replay.status_code == 403

    # JupyterLab is served, and a file written through the server lands in the next snapshot.
    lab = _lab(world, browser, me)
    assert lab.status_code == 200 and "JupyterLab" in lab.text, lab.text[-1000:]
    written = _put_file(world, browser, me, "from_lab.txt", "written in JupyterLab\n")
    assert written.status_code in (200, 201), written.text
    files = world.snapshot_files(me)
    assert files.get("from_lab.txt") == b"written in JupyterLab\n"

    # The server runs in the attempt's own container, as the workspace user, not a new one.
    owner = browser.get(
        world.hub_url(f"/user/{me.hub_user}/{me.server}/api/contents/from_lab.txt"),
        params={"content": "0"},
        timeout=30,
    )
    assert owner.status_code == 200 and owner.json()["writable"] is True

    # The other participant's server (running) and hub records are out of my reach.
    other_browser = _login_and_open(world, other)
    assert _lab(world, other_browser, other).status_code == 200
    foreign = browser.get(
        world.hub_url(f"/user/{other.hub_user}/{other.server}/api/contents"), timeout=30
    )
    assert foreign.status_code in (403, 404)
    assert "from_lab" not in foreign.text
    foreign_put = _put_file(world, browser, other, "intruder.txt", "no")
    assert foreign_put.status_code in (403, 404)
    spawn_other = browser.get(world.hub_url(f"/hub/spawn/{other.hub_user}/{other.server}"))
    assert spawn_other.status_code in (403, 404)
    api_other = browser.get(world.hub_url(f"/hub/api/users/{other.hub_user}"))
    assert api_other.status_code in (403, 404)
    # Naming another attempt as a server of my own hub user: the portal refuses the spawn.
    sneaky = browser.get(world.hub_url(f"/hub/spawn/{me.hub_user}/{other.server}"), timeout=60)
    assert sneaky.status_code >= 400
    mine = requests.get(
        world.hub_url(f"/hub/api/users/{me.hub_user}"), headers=world.service_headers()
    ).json()
    assert not (mine["servers"].get(other.server) or {}).get("ready")
    assert "intruder.txt" not in world.snapshot_files(other)

    # A hub restart keeps the server running and its route: the same cookies reach JupyterLab.
    pid_before = world.wait_ready(me)
    world.stop_hub()
    world.start_hub()
    assert world.wait_ready(me)["started"] == pid_before["started"]
    again = _put_file(world, browser, me, "after_restart.txt", "still here\n")
    assert again.status_code in (200, 201), again.text + world.hub_log()[-2000:]
    assert world.snapshot_files(me)["after_restart.txt"] == b"still here\n"


def test_open_workspace_refused_with_a_reason(world: HubWorld) -> None:
    world.add_participants(1)
    (me,) = world.participants
    browser = world.portal_login(me)
    # Not my attempt: missing, as everywhere else in the portal.
    foreign = browser.post(f"{world.portal_url}/attempts/{me.attempt_id + 999}/workspace")
    assert foreign.status_code in (400, 404)
    # The hub is down: the portal says so instead of sending the participant to an error page.
    world.stop_hub()
    answer = world.open_workspace(browser, me)
    assert answer.status_code == 409
    assert "JupyterHub is not answering" in answer.text
    assert world.attempt(me).first_login_at is None  # and the clock did not start
