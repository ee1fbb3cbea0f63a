"""JupyterHub end to end: the real portal, hub, proxy and Docker workspaces (no stand-ins).

A participant logs into the portal, "Open workspace" carries a one-time token to the hub, the hub
spawns JupyterLab inside the attempt's existing container (egress `none`: no network, so every
byte goes through the spawner's docker-exec tunnel), a file written through the single-user
server's API is in the next snapshot, and the clock started at that login. Another participant's
server, spawn and hub API routes are refused; a used login token is refused; a hub restart keeps
the server and its route.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import html
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urljoin, urlparse

import pytest
import requests
from sqlalchemy import select

from app.blueprints.attempts import fmt_hours
from baseline.attempts import attempts, snapshots
from baseline.models import AuditEvent, PauseReason, Role
from baseline.models import Participant as Participant_
from baseline.people import accounts
from baseline.workspaces import terminal_records
from tests.app.chromium import chromium, log_in, open_lab_terminal
from tests.docker_env import docker_url, test_image
from tests.hub_world import (
    PASSWORD,
    HubWorld,
    Participant,
    database_url,
    factory,
    settings,
    world,
)

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["database_url", "settings", "test_image", "world"]  # fixtures used below


def _login_and_open(world: HubWorld, who: Participant) -> requests.Session:
    browser = world.portal_login(who)
    landed = world.open_workspace(browser, who)
    assert landed.status_code == 200, landed.text[-2000:]
    world.wait_ready(who)
    lab = _lab(world, browser, who)  # the single-user server's OAuth login and _xsrf cookie
    assert lab.status_code == 200 and "JupyterLab" in lab.text
    return browser


def _lab(world: HubWorld, browser: requests.Session, who: Participant) -> requests.Response:
    return browser.get(world.hub_url(f"/user/{who.hub_user}/{who.server}/lab"), timeout=60)


def _put_file(
    world: HubWorld, browser: requests.Session, who: Participant, name: str, text: str
) -> requests.Response:
    xsrf = browser.cookies.get("_xsrf", path=f"/user/{who.hub_user}/{who.server}/") or ""
    return browser.put(
        world.hub_url(f"/user/{who.hub_user}/{who.server}/api/contents/submission/{name}"),
        json={"type": "file", "format": "text", "content": text},
        headers={"X-XSRFToken": xsrf},
        timeout=60,
    )


def test_participant_works_in_own_workspace_through_the_hub(world: HubWorld) -> None:
    world.add_participants(2)
    me, other = world.participants
    browser = world.portal_login(me)

    # "Start working" leads to the work page, whose frame carries a one-time token and the spawn
    # path of my own attempt; the page's address carries none, and shows it once.
    page = browser.get(f"{world.portal_url}/attempts/{me.attempt_id}").text
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf
    first = browser.post(
        f"{world.portal_url}/attempts/{me.attempt_id}/workspace",
        data={"csrf_token": csrf.group(1)},
        allow_redirects=False,
    )
    assert first.status_code == 302
    work_url = urljoin(world.portal_url, first.headers["Location"])
    assert work_url == f"{world.portal_url}/attempts/{me.attempt_id}/work"
    frame = re.search(r'<iframe id="lab" src="([^"]+)"', browser.get(work_url).text)
    assert frame
    login_url = html.unescape(frame.group(1))
    target = urlparse(login_url)
    query = parse_qs(target.query)
    assert f"{target.scheme}://{target.netloc}{target.path}" == world.hub_url("/hub/login")
    assert query["next"] == [f"/hub/spawn/{me.hub_user}/{me.server}"]
    assert "login_token" not in browser.get(work_url).text
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
        world.hub_url(f"/user/{me.hub_user}/{me.server}/api/contents/submission/from_lab.txt"),
        params={"content": "0"},
        timeout=30,
    )
    assert owner.status_code == 200 and owner.json()["writable"] is True
    # Issue 39 item 6: the file browser opens in the submission, and the paper is beside it,
    # readable but not writable.
    paper = browser.get(
        world.hub_url(f"/user/{me.hub_user}/{me.server}/api/contents/paper"), timeout=30
    )
    assert paper.status_code == 200 and paper.json()["content"], paper.text
    assert paper.json()["writable"] is False
    defaced = browser.put(
        world.hub_url(f"/user/{me.hub_user}/{me.server}/api/contents/paper/defaced.txt"),
        json={"type": "file", "format": "text", "content": "no"},
        headers={
            "X-XSRFToken": browser.cookies.get("_xsrf", path=f"/user/{me.hub_user}/{me.server}/")
            or ""
        },
        timeout=30,
    )
    assert defaced.status_code >= 400, defaced.text

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

    # Staff reach a participant's JupyterLab only through the audited "observe" action, and then
    # that one server only.
    with world.ctx.session() as session:
        coordinator = accounts.create_user(
            session, "hub-coord@test.example", "Coord", PASSWORD, Role.COORDINATOR
        )
        staff_id = coordinator.id
    staff = world.portal_login(Participant(staff_id, "hub-coord@test.example", me.attempt_id))
    unannounced = staff.get(world.hub_url(f"/user/{me.hub_user}/{me.server}/api/contents"))
    assert unannounced.status_code == 403 and "from_lab" not in unannounced.text
    page = staff.get(f"{world.portal_url}/attempts/{me.attempt_id}").text
    assert 'id="observe-workspace"' in page
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf
    observed = staff.post(
        f"{world.portal_url}/attempts/{me.attempt_id}/observe",
        data={"csrf_token": csrf.group(1)},
        timeout=120,
    )
    # JupyterHub itself asks a non-owner to authorize access to someone else's server.
    assert "/hub/api/oauth2/authorize" in observed.url and "Authorize" in observed.text
    fields = [
        ("_xsrf", re.findall(r'name="_xsrf" value="([^"]*)"', observed.text)[0]),
        *(("scopes", v) for v in re.findall(r'name="scopes" value="([^"]*)"', observed.text)),
    ]
    observed = staff.post(observed.url, data=fields, timeout=120)
    assert observed.status_code == 200 and "JupyterLab" in observed.text, world.hub_log()[-3000:]
    assert f"/user/{me.hub_user}/{me.server}/lab" in observed.url
    lab_files = f"/user/{me.hub_user}/{me.server}/api/contents/submission"
    seen = staff.get(world.hub_url(f"{lab_files}/from_lab.txt"))
    assert seen.status_code == 200 and seen.json()["name"] == "from_lab.txt"
    elsewhere = staff.get(world.hub_url(f"/user/{other.hub_user}/{other.server}/api/contents"))
    assert elsewhere.status_code in (403, 404) and "intruder" not in elsewhere.text
    with world.ctx.session() as session:
        actions = session.scalars(
            select(AuditEvent.action).where(
                AuditEvent.actor_id == staff_id, AuditEvent.target_id == str(me.attempt_id)
            )
        ).all()
    assert "hub.observe" in actions and "hub.observe_login" in actions

    # A hub restart keeps the server running and its route: the same cookies reach JupyterLab.
    pid_before = world.wait_ready(me)
    world.stop_hub()
    world.start_hub()
    assert world.wait_ready(me)["started"] == pid_before["started"]
    again = _put_file(world, browser, me, "after_restart.txt", "still here\n")
    assert again.status_code in (200, 201), again.text + world.hub_log()[-2000:]
    assert world.snapshot_files(me)["after_restart.txt"] == b"still here\n"

    # Issue 39 item 4: a participant mints no hub API token (the API and the Token page refuse),
    # and the hub's pages show neither Token nor Stop Server but lead back to the portal.
    hub_xsrf = {"X-XSRFToken": browser.cookies.get("_xsrf", path="/hub/") or ""}
    minted = browser.post(
        world.hub_url(f"/hub/api/users/{me.hub_user}/tokens"), json={}, headers=hub_xsrf
    )
    assert minted.status_code == 403, minted.text
    token_page = browser.get(world.hub_url("/hub/token"))
    assert token_page.status_code == 403 and 'id="back-to-portal"' in token_page.text
    assert world.portal_url in token_page.text
    home = browser.get(world.hub_url("/hub/home"))
    assert home.status_code == 200 and "Stop" not in home.text and "Token" not in home.text
    denied = browser.get(world.hub_url(f"/hub/spawn/{other.hub_user}/{other.server}"))
    assert denied.status_code in (403, 404) and 'id="back-to-portal"' in denied.text

    # A terminal and a kernel open at the logout, and the credentials the browser holds: the
    # hub cookie and the server's OAuth token (in its cookie), kept as a participant could.
    lab_api = world.hub_url(f"/user/{me.hub_user}/{me.server}/api")
    xsrf = {"X-XSRFToken": browser.cookies.get("_xsrf", path=f"/user/{me.hub_user}/{me.server}/")}
    assert browser.post(f"{lab_api}/terminals", headers=xsrf).status_code == 200
    assert browser.post(f"{lab_api}/kernels", json={}, headers=xsrf).status_code == 201
    kept = requests.Session()
    kept.cookies = copy.deepcopy(browser.cookies)
    oauth_token = _server_token(browser, me)
    as_token = {"Authorization": f"token {oauth_token}"}
    assert requests.get(f"{lab_api}/contents", headers=as_token).status_code == 200
    processes = world.workspace_processes(me)
    assert "ipykernel" in processes and "jupyterhub-singleuser" in processes

    # Logging out of the portal ends the hub session: JupyterLab is no longer reachable.
    page = browser.get(f"{world.portal_url}/attempts/{me.attempt_id}").text
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf
    out = browser.post(f"{world.portal_url}/logout", data={"csrf_token": csrf.group(1)})
    assert out.url.startswith(f"{world.portal_url}/login")
    after = browser.get(
        world.hub_url(f"/user/{me.hub_user}/{me.server}/api/contents/submission/after_restart.txt"),
        timeout=30,
    )
    assert after.status_code != 200 or "still here" not in after.text
    # The kept cookies and the server's token open nothing any more: no contents, no terminal,
    # no kernel, no hub API; the open terminal and kernel are gone with the server.
    for holder, headers in ((kept, xsrf), (requests.Session(), as_token)):
        contents = holder.get(f"{lab_api}/contents", headers=headers, allow_redirects=False)
        assert contents.status_code != 200, contents.text
        terminal = holder.post(f"{lab_api}/terminals", headers=headers, allow_redirects=False)
        assert terminal.status_code not in (200, 201), terminal.text
        kernel = holder.post(f"{lab_api}/kernels", headers=headers, allow_redirects=False)
        assert kernel.status_code not in (200, 201), kernel.text
    hub_api = requests.get(world.hub_url(f"/hub/api/users/{me.hub_user}"), headers=as_token)
    assert hub_api.status_code in (401, 403, 404)
    processes = world.workspace_processes(me)
    assert "ipykernel" not in processes and "jupyterhub-singleuser" not in processes, processes
    with world.ctx.session() as session:
        logouts = session.scalars(
            select(AuditEvent.action).where(AuditEvent.actor_id == me.user_id)
        ).all()
    assert "hub.logout" in logouts
    # Staff then observe nothing, told why (not the hub's "404: No such user").
    page = staff.get(f"{world.portal_url}/attempts/{me.attempt_id}").text
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf
    gone = staff.post(
        f"{world.portal_url}/attempts/{me.attempt_id}/observe",
        data={"csrf_token": csrf.group(1)},
        allow_redirects=False,
    )
    assert gone.status_code == 409 and "logged out" in gone.text, gone.text[:500]


def _server_token(browser: requests.Session, who: Participant) -> str:
    """The OAuth access token the single-user server keeps in its cookie (a tornado signed
    value, readable without the secret): what a participant could copy out of the browser."""
    value = next(
        c.value or ""
        for c in browser.cookies
        if c.name.startswith(f"jupyterhub-user-{who.hub_user}")
    ).strip('"')
    fields = value.split("|")
    assert fields[0] == "2", value
    return base64.b64decode(fields[4].split(":", 1)[1]).decode()


def test_open_workspace_refusals_and_submit(world: HubWorld) -> None:
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

    # Submitting from the attempt page is final and needs an explicit confirmation.
    assert attempts.first_login(world.ctx, me.attempt_id, me.user_id)
    page = browser.get(f"{world.portal_url}/attempts/{me.attempt_id}").text
    assert f'action="/attempts/{me.attempt_id}/submit"' in page
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf
    submit_url = f"{world.portal_url}/attempts/{me.attempt_id}/submit"
    unconfirmed = browser.post(submit_url, data={"csrf_token": csrf.group(1)})
    assert unconfirmed.status_code == 422 and "final" in unconfirmed.text
    done = browser.post(submit_url, data={"csrf_token": csrf.group(1), "confirm": "yes"})
    assert done.status_code == 200 and "Submitted: final snapshot" in done.text
    assert world.attempt(me).status.value == "submitted"
    closed = browser.post(
        f"{world.portal_url}/attempts/{me.attempt_id}/workspace",
        data={"csrf_token": csrf.group(1)},
    )
    assert closed.status_code == 409 and "cannot be opened" in closed.text


def test_workspace_restarted_by_baseline_while_the_server_runs(world: HubWorld) -> None:
    """The server dies with its container; the hub notices (poll), and it opens again."""
    world.add_participants(1)
    (me,) = world.participants
    browser = _login_and_open(world, me)
    assert _put_file(world, browser, me, "before.txt", "kept\n").status_code in (200, 201)
    first = world.wait_ready(me)
    world.restart_workspace(me)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and world.server_state(me) is not None:
        time.sleep(1)
    assert world.server_state(me) is None, "the hub did not notice the server was gone"
    landed = world.open_workspace(browser, me)
    assert landed.status_code == 200
    second = world.wait_ready(me)
    assert _lab(world, browser, me).status_code == 200
    assert second["started"] != first["started"]
    kept = browser.get(
        world.hub_url(f"/user/{me.hub_user}/{me.server}/api/contents/submission/before.txt"),
        timeout=30,
    )
    assert kept.status_code == 200 and kept.json()["content"] == "kept\n"

    # Stopping the server (hub API) ends that process only; the workspace keeps running.
    stop = requests.delete(
        world.hub_url(f"/hub/api/users/{me.hub_user}/servers/{me.server}"),
        headers=world.service_headers(),
        timeout=60,
    )
    assert stop.status_code in (202, 204)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and world.server_state(me) is not None:
        time.sleep(0.5)
    assert "jupyterhub-singleuser" not in world.workspace_processes(me)
    assert world.workspace_file(me, "before.txt") == b"kept\n"  # container still up


@pytest.mark.sshd
def test_workspace_on_a_remote_host_over_ssh(world: HubWorld) -> None:
    """The workspace's engine is ssh://: the spawner's exec and tunnel go over SSH."""
    world.add_participants(1, engine_url=docker_url("ssh"))
    (me,) = world.participants
    browser = _login_and_open(world, me)
    lab = _lab(world, browser, me)
    assert lab.status_code == 200 and "JupyterLab" in lab.text
    written = _put_file(world, browser, me, "over_ssh.txt", "via the tunnel\n")
    assert written.status_code in (200, 201), written.text
    assert world.snapshot_files(me)["over_ssh.txt"] == b"via the tunnel\n"
    target = requests.get(
        f"{world.portal_url}/hub-service/server",
        params={"user": me.hub_user, "name": me.server},
        headers={"Authorization": f"Bearer {world.config.service_token()}"},  # type: ignore[union-attr]
    ).json()
    assert target["docker_url"].startswith("ssh://")  # what the spawner was told to use


def _frame_url(driver: Any) -> str:
    """The address of the frame the driver is in (its `current_url` is the window's)."""
    return str(driver.execute_script("return location.href"))


@pytest.mark.browser
def test_browser_portal_login_to_jupyterlab_terminal(world: HubWorld, tmp_path: Path) -> None:
    """Chromium: portal login, "Open workspace", JupyterLab, a terminal writes a file, snapshot."""
    from selenium.common.exceptions import (
        ElementClickInterceptedException,
        NoSuchElementException,
        NoSuchFrameException,
        StaleElementReferenceException,
        WebDriverException,
    )
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    world.add_participants(1)
    (me,) = world.participants
    with world.ctx.session() as session:  # a first-time participant: consent not given yet
        first_timer = session.get(Participant_, world.attempt(me).participant_id)
        assert first_timer is not None
        first_timer.consent_accepted_at = None
    screenshot = tmp_path / "jupyterlab-terminal.png"
    with chromium() as driver:
        driver.set_page_load_timeout(180)
        log_in(driver, world.portal_url, me.email, PASSWORD)
        # Issue 39 item 6: the login lands on the attempt, whose one button is "Start working";
        # the consent asked on the way in continues into JupyterLab in that one new tab.
        WebDriverWait(driver, 30).until(
            lambda d: d.current_url.endswith(f"/attempts/{me.attempt_id}")
        )
        driver.save_screenshot(str(tmp_path / "portal-attempt-not-started.png"))
        work_tab = driver.current_window_handle
        start = driver.find_element(By.ID, "open-workspace")
        assert start.text == "Start working" and "Open workspace" not in driver.page_source
        start.click()
        # One tab from login to JupyterLab: consent, then the work page with JupyterLab in it.
        WebDriverWait(driver, 30).until(ec.element_to_be_clickable((By.NAME, "accept"))).click()
        driver.save_screenshot(str(tmp_path / "portal-consent.png"))
        driver.find_element(By.ID, "accept-consent").click()
        wait = WebDriverWait(driver, 180)
        wait.until(lambda d: d.current_url.endswith(f"/attempts/{me.attempt_id}/work"))
        assert driver.window_handles == [work_tab]
        paper = driver.find_element(By.ID, "paper-link").get_attribute("href")
        assert paper and paper.startswith(f"{world.portal_url}/tasks/")
        limit = fmt_hours(world.attempt(me).working_time_limit_s)
        assert driver.find_element(By.ID, "limit").text == limit
        driver.switch_to.frame("lab")
        wait.until(lambda d: f"/user/{me.hub_user}/{me.server}/lab" in _frame_url(d))
        open_lab_terminal(driver, wait)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, ".jp-Terminal .xterm-screen")))
        driver.find_element(By.CSS_SELECTOR, ".jp-Terminal .xterm-screen").click()
        ActionChains(driver).send_keys(
            "(echo typed-in-the-terminal; whoami; pwd) > from_terminal.txt\n"
        ).perform()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not world.workspace_file(me, "from_terminal.txt"):
            time.sleep(1)
        assert "Jupyter news" not in driver.page_source  # JupyterLab's news pop-up is off
        # The bar above JupyterLab: the working clock ticks (the clock started at this login).
        driver.switch_to.default_content()
        shown = driver.find_element(By.ID, "working").text
        WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "working").text != shown)
        assert driver.find_element(By.ID, "work-status").text == "running"
        driver.save_screenshot(str(screenshot))
        # Issue 39 item 4: the portal's logout (in another tab) ends the terminal still open here.
        driver.switch_to.new_window("tab")
        driver.get(f"{world.portal_url}/attempts/{me.attempt_id}")
        driver.find_element(By.XPATH, "//button[normalize-space()='Log out']").click()
        WebDriverWait(driver, 60).until(lambda d: "/login" in d.current_url)
        driver.switch_to.window(work_tab)
        # The old terminal, typed into before the work page closes JupyterLab (if it did first,
        # or JupyterLab already closed the terminal whose server went away, or the hub already
        # sent the frame to its refusal, nothing can be typed at all). JupyterLab's own dialog
        # may already say the server went away: the keys are typed anyway.
        try:
            driver.switch_to.frame("lab")
            with contextlib.suppress(ElementClickInterceptedException):
                driver.find_element(By.CSS_SELECTOR, ".jp-Terminal .xterm-screen").click()
            ActionChains(driver).send_keys("echo after-logout > after_logout.txt\n").perform()
            time.sleep(1.5)  # a live terminal runs it in well under a second
        except (NoSuchFrameException, NoSuchElementException, StaleElementReferenceException):
            pass
        except WebDriverException as exc:
            # Chromium's word for the terminal of a frame the work page removed meanwhile (CI)
            if "does not belong to the document" not in str(exc.msg):
                raise
        driver.switch_to.default_content()
        # The work page, at its next look at the portal, closes JupyterLab and says why.
        WebDriverWait(driver, 30).until(lambda d: not d.find_elements(By.ID, "lab"))
        assert "You are logged out" in driver.find_element(By.ID, "work-notice").text
        driver.save_screenshot(str(tmp_path / "work-page-after-logout.png"))
        assert world.workspace_file(me, "after_logout.txt") == b"", "the terminal outlived logout"
        # The hub, reached without the portal, refuses with a way back to it.
        driver.get(world.hub_url(f"/user/{me.hub_user}/{me.server}/lab"))
        driver.save_screenshot(str(tmp_path / "hub-refusal-after-logout.png"))
        back = driver.find_element(By.ID, "back-to-portal")
        assert back.get_attribute("href") == f"{world.portal_url}/"
        # The refusal's message once (JupyterHub's heading repeated it as the status text).
        shown = driver.find_element(By.TAG_NAME, "body").text
        assert shown.count("Open your workspace from the Baseline portal.") == 1, shown
        assert "Error 403" in shown
    print(f"JupyterLab screenshot: {screenshot}")
    assert screenshot.stat().st_size > 10_000
    files = world.snapshot_files(me)
    # Typed in JupyterLab's terminal, run as the unprivileged workspace user in the submission.
    assert (
        files.get("from_terminal.txt") == b"typed-in-the-terminal\nparticipant\n/home/submission\n"
    )
    attempt = world.attempt(me)
    assert attempt.first_login_at is not None and attempt.status.value == "running"
    # That terminal is on record (a login shell under `script`), with the shell history.
    with world.ctx.session() as session:
        assert terminal_records.collect(session, me.attempt_id, factory) >= 2
        texts = {
            row.kind: terminal_records.printable(row.content)
            for row in terminal_records.recordings(session, me.attempt_id)
        }
    assert "$ (echo typed-in-the-terminal; whoami; pwd) > from_terminal.txt" in texts["session"]
    assert "(echo typed-in-the-terminal; whoami; pwd) > from_terminal.txt" in texts["history"]


@pytest.mark.browser
def test_browser_a_paused_participants_terminal_and_background_job_do_not_run(
    world: HubWorld, tmp_path: Path
) -> None:
    """Issue 39 item 2, in Chromium: a background job started in JupyterLab's terminal writes
    nothing while the participant's clock is paused, a command typed into that terminal during
    the pause does not run and is not in the snapshot taken then; after the resume the job goes on,
    the typed line runs (on the running clock) and the terminal takes commands again.

    Issue 39 item 6, on the same work page (JupyterLab under the portal's bar): pause and resume
    from the bar, which shows the pause; a hub restart pops no "restart your server?" dialog in
    JupyterLab while the bar says it is reconnecting; the end of the attempt replaces the open
    JupyterLab with "Your attempt has ended"."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    world.add_participants(1)
    (me,) = world.participants
    shots = tmp_path / "screenshots"
    shots.mkdir()

    def ticks() -> int:
        return len(world.workspace_file(me, "ticks.txt").splitlines())

    def until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, what
            time.sleep(0.5)

    def bar(element_id: str) -> str:
        return str(driver.find_element(By.ID, element_id).text)

    def in_lab(keys: str) -> None:
        driver.switch_to.frame("lab")
        driver.find_element(*screen).click()
        ActionChains(driver).send_keys(keys).perform()
        driver.switch_to.default_content()

    screen = (By.CSS_SELECTOR, ".jp-Terminal .xterm-screen")
    with chromium() as driver:
        driver.set_page_load_timeout(180)
        log_in(driver, world.portal_url, me.email, PASSWORD)
        driver.get(f"{world.portal_url}/attempts/{me.attempt_id}")
        driver.find_element(By.ID, "open-workspace").click()
        wait = WebDriverWait(driver, 180)
        wait.until(lambda d: d.current_url.endswith(f"/attempts/{me.attempt_id}/work"))
        driver.switch_to.frame("lab")
        wait.until(lambda d: f"/user/{me.hub_user}/{me.server}/lab" in _frame_url(d))
        open_lab_terminal(driver, wait)
        wait.until(ec.presence_of_element_located(screen))
        # The running sessions' panel, whose refresh asks the server (for the hub restart below).
        driver.find_element(By.CSS_SELECTOR, "[data-id='jp-running-sessions']").click()
        driver.switch_to.default_content()
        in_lab("(while :; do date +%s%N >> ticks.txt; sleep 0.2; done) &\n")
        until(lambda: ticks() > 0, "the background job never wrote")

        # Paused from the bar above JupyterLab, which says so.
        driver.find_element(By.CSS_SELECTOR, "#pause-form button").click()
        until(lambda: bar("work-status") == "paused (participant)", "the bar shows no pause", 30)
        assert "held still" in bar("work-notice")
        assert driver.find_element(By.ID, "resume-form").is_displayed()
        assert not driver.find_element(By.ID, "pause-form").is_displayed()
        assert world.attempt(me).status.value == "paused"
        held_at = bar("working")

        in_lab("echo typed-while-paused > paused.txt\n")
        held = ticks()
        time.sleep(4)
        driver.save_screenshot(str(shots / "work-page-paused.png"))
        assert bar("working") == held_at, "the bar's clock ran during the pause"
        assert world.workspace_file(me, "paused.txt") == b"", "the command ran during the pause"
        assert ticks() == held, "the background job wrote during the pause"
        during = world.snapshot_files(me)
        assert "paused.txt" not in during
        assert len(during["ticks.txt"].splitlines()) == held

        driver.find_element(By.CSS_SELECTOR, "#resume-form button").click()
        until(lambda: bar("work-status") == "running", "the bar shows no resume", 30)
        # Resumed, the held processes go on and the same terminal takes commands again.
        until(lambda: ticks() > held, "the background job did not go on after the resume")
        in_lab("echo typed-after-resume > resumed.txt\n")
        until(lambda: world.workspace_file(me, "resumed.txt") != b"", "the terminal after resume")
        driver.save_screenshot(str(shots / "work-page-resumed.png"))
        # The line typed during the pause waited in the terminal: it ran after the resume.
        assert world.workspace_file(me, "paused.txt") == b"typed-while-paused\n"

        # The hub restarts (as its supervisor restarts it): JupyterLab's requests fail meanwhile;
        # it shows no dialog, the bar says it is reconnecting.
        driver.get_log("browser")  # what was logged so far
        world.stop_hub()
        until(lambda: "Reconnecting" in bar("work-notice"), "the bar says nothing of the hub", 30)
        driver.switch_to.frame("lab")
        refresh = "//*[@id='jp-running-sessions']//*[@title='Refresh List']"
        driver.find_element(By.XPATH, refresh).click()
        deadline = time.monotonic() + 20
        quiet = False
        while not quiet and time.monotonic() < deadline:
            dialogs = driver.find_elements(By.CSS_SELECTOR, ".jp-Dialog")
            assert not dialogs, "JupyterLab asks: " + dialogs[0].text
            logged = " ".join(e["message"] for e in driver.get_log("browser"))
            quiet = "baseline-lab: the server is not answering" in logged
            time.sleep(0.5)
        driver.switch_to.default_content()
        driver.save_screenshot(str(shots / "work-page-hub-restarting.png"))
        assert quiet, "JupyterLab's connection-lost handler never ran (no request failed?)"
        world.start_hub()
        until(lambda: "Reconnecting" not in bar("work-notice"), "the bar still reconnects", 60)

        # The attempt ends while JupyterLab is open: the page says so, JupyterLab is gone.
        attempts.submit(
            world.ctx, me.attempt_id, me.user_id, snapshots.resolve_source, backend_factory=factory
        )
        until(lambda: driver.find_element(By.ID, "ended").is_displayed(), "no end shown", 30)
        driver.save_screenshot(str(shots / "work-page-ended.png"))
        assert "Your attempt has ended" in bar("ended") and "Submitted" in bar("ended-reason")
        assert not driver.find_elements(By.ID, "lab")
        assert "Kernel died" not in driver.page_source
    print(f"screenshots: {sorted(p.name for p in shots.iterdir())}")
