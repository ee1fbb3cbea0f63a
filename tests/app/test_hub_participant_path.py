"""Issue 39 item 6, the portal's side of a participant's path (no hub, no Docker): a login lands on
the participant's attempt; a not-started attempt offers one button, "Start working"; the clock
keeps counting on the page (working time, at the attempt's time scale, never the time-scaled
wall time); consent asked on the way in continues into the workspace."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from flask.testing import FlaskClient

from baseline.attempts import attempts, snapshots
from baseline.context import Context
from baseline.models import Attempt, AttemptStatus, PauseReason, Role, Task, TaskKind, utcnow
from baseline.people import accounts
from baseline.studies import studies
from tests.conftest import PASSWORD, Users


@dataclass
class Started:
    attempt_id: int
    email: str


@pytest.fixture
def started(ctx: Context, users: Users) -> Started:
    """A participant's attempt, launched, its clock waiting for their first login (ready)."""
    with ctx.session() as session:
        me = accounts.create_user(session, "path@test.example", "Path", PASSWORD, Role.PARTICIPANT)
        study = studies.create_study(session, studies.StudySpec(name="Path study"), None)
        task = Task(slug="path-task", title="Path", kind=TaskKind.PAPER, content_hash="0" * 64)
        session.add(task)
        session.flush()
        studies.add_task(session, study, task, None)
        session.flush()
        session.refresh(study)
        attempt_id = studies.create_attempt(
            session, studies.enroll_human(session, study.id, me, None), task, None
        ).id
    attempts.start(ctx, attempt_id, None, snapshots.resolve_source)
    return Started(attempt_id, "path@test.example")


def _login(client: FlaskClient, email: str) -> str:
    page = client.get("/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf
    done = client.post(
        "/login", data={"email": email, "password": PASSWORD, "csrf_token": csrf.group(1)}
    )
    assert done.status_code == 302
    return done.headers["Location"]


def test_a_participant_lands_on_their_attempt(
    client: FlaskClient, users: Users, started: Started
) -> None:
    landed = client.get(_login(client, started.email))
    assert landed.status_code == 302
    assert landed.headers["Location"].endswith(f"/attempts/{started.attempt_id}")


def test_a_participant_without_attempts_lands_on_their_list(
    client: FlaskClient, users: Users
) -> None:
    landed = client.get(_login(client, users[Role.PARTICIPANT].email))
    assert landed.status_code == 302 and landed.headers["Location"].endswith("/attempts/")


def test_staff_still_land_on_the_studies(client: FlaskClient, users: Users) -> None:
    assert _login(client, users[Role.COORDINATOR].email).endswith("/studies/")


def test_a_not_started_attempt_offers_only_start_working(
    client: FlaskClient, started: Started
) -> None:
    _login(client, started.email)
    page = client.get(f"/attempts/{started.attempt_id}").get_data(as_text=True)
    assert re.search(r'<button id="open-workspace">Start working</button>', page)
    assert "Open workspace" not in page and "/begin" not in page
    # Not running yet: the clock on the page stands still.
    assert 'data-tick="0"' in page and "clock.js" in page


def test_the_clock_counts_working_time_on_the_page(
    ctx: Context, client: FlaskClient, started: Started
) -> None:
    with ctx.session() as session:
        owner = session.get(Attempt, started.attempt_id)
        assert owner is not None and owner.participant.user_id is not None
        user_id = owner.participant.user_id
    attempts.first_login(ctx, started.attempt_id, user_id)
    with ctx.session() as session:
        attempt = session.get(Attempt, started.attempt_id)
        assert attempt is not None
        attempt.time_scale = 30.0
    _login(client, started.email)
    page = client.get(f"/attempts/{started.attempt_id}").get_data(as_text=True)
    assert re.search(r'id="working" data-tick="30.0"', page)
    assert re.search(r'id="remaining" data-tick="-30.0"', page)
    assert '<button id="open-workspace">Open workspace</button>' in page
    # The participant is shown their working time, not the time-scaled wall time.
    assert 'id="wall"' not in page and "(your attempt's limit)" in page
    assert client.get("/static/clock.js").status_code == 200


def test_consent_asked_on_the_way_in_continues_into_the_workspace(
    ctx: Context, client: FlaskClient, started: Started
) -> None:
    _login(client, started.email)
    page = client.get(f"/attempts/{started.attempt_id}").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert csrf
    # Where "Open workspace" sends a participant who has not consented yet (tests/app/test_hub.py
    # follows it through the hub):
    way_in = f"/attempts/{started.attempt_id}/consent?continue=workspace"
    consent = client.get(way_in).get_data(as_text=True)
    assert 'name="continue" value="workspace"' in consent
    assert "Accept and open my workspace" in consent
    accepted = client.post(
        way_in,
        data={"csrf_token": csrf.group(1), "accept": "yes", "continue": "workspace"},
    )
    # On into the workspace, not back to the attempt page: here it has none running, and the
    # answer says so (the hub's path itself is the browser test's, tests/app/test_hub.py).
    assert accepted.status_code == 409, accepted.get_data(as_text=True)
    assert "is not running" in accepted.get_data(as_text=True)


def _work_state(client: FlaskClient, attempt_id: int) -> dict[str, object]:
    answer = client.get(f"/attempts/{attempt_id}/work/state")
    assert answer.status_code == 200 and answer.headers["Cache-Control"] == "no-store"
    state = answer.get_json()
    assert isinstance(state, dict)
    return state


def test_the_work_page_bar_shows_the_clock_the_paper_and_the_end(
    ctx: Context, client: FlaskClient, users: Users, started: Started
) -> None:
    """Issue 39 item 6, the work page without a hub (the browser test has JupyterLab in it): the
    bar's clock, limit and paper; JupyterLab framed only once the participant has logged in (a
    reload frames it directly, no login token in the page); the end replaces it."""
    _login(client, started.email)
    page = client.get(f"/attempts/{started.attempt_id}/work").get_data(as_text=True)
    assert 'id="working"' in page and 'data-tick="0.0"' in page and "work.js" in page
    assert re.search(r'id="limit">\d+:00:00</span>', page)
    assert re.search(r'id="paper-link" href="/tasks/\d+/paper" target="_blank"', page)
    # Not logged into the hub yet: no frame, the one button that starts working.
    assert "<iframe" not in page and '<button id="open-workspace">Start working</button>' in page
    assert _work_state(client, started.attempt_id)["label"] == "not started"

    with ctx.session() as session:
        owner = session.get(Attempt, started.attempt_id)
        assert owner is not None and owner.participant.user_id is not None
        user_id = owner.participant.user_id
    attempts.first_login(ctx, started.attempt_id, user_id)
    page = client.get(f"/attempts/{started.attempt_id}/work").get_data(as_text=True)
    lab = re.search(r'<iframe id="lab" src="([^"]+)"', page)
    assert lab and lab.group(1).endswith(f"/user/u{user_id}/a{started.attempt_id}/lab")
    assert "login_token" not in page
    state = _work_state(client, started.attempt_id)
    assert state["label"] == "running" and state["rate"] == 1.0 and state["can_pause"]
    assert not state["ended"] and not state["can_resume"]

    attempts.pause(ctx, started.attempt_id, PauseReason.PARTICIPANT, user_id, "")
    state = _work_state(client, started.attempt_id)
    assert state["label"] == "paused (participant)" and state["rate"] == 0.0
    assert state["held"] and state["can_resume"] and not state["can_pause"]
    assert str(state["notice"]).startswith("Paused: the workspace is held still")
    page = client.get(f"/attempts/{started.attempt_id}/work").get_data(as_text=True)
    assert 'id="pause-form" hidden' in page and "held still" in page

    with ctx.session() as session:  # ended as the schedule ends it (no workspace to snapshot)
        ending = session.get(Attempt, started.attempt_id)
        assert ending is not None
        ending.status, ending.ended_at = AttemptStatus.ENDED, utcnow()
        ending.end_reason = "working-time limit reached"
    state = _work_state(client, started.attempt_id)
    assert state["ended"] and state["end_reason"] == "working-time limit reached"
    page = client.get(f"/attempts/{started.attempt_id}/work").get_data(as_text=True)
    assert "<iframe" not in page and "Your attempt has ended" in page
    assert "Working-time limit reached." in page
    assert 'id="ended" class="card" hidden' not in page


def test_another_participants_work_page_is_not_found(
    client: FlaskClient, users: Users, started: Started
) -> None:
    _login(client, users[Role.PARTICIPANT].email)
    assert client.get(f"/attempts/{started.attempt_id}/work").status_code == 404
    assert client.get(f"/attempts/{started.attempt_id}/work/state").status_code == 404


class _CountingHub(BaseHTTPRequestHandler):
    """A hub's health endpoint that counts how often it is asked."""

    asked = 0

    def do_GET(self) -> None:
        type(self).asked += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads the count, not the log."""


@pytest.mark.sqlite_only
def test_work_pages_polling_together_ask_the_hub_once(
    ctx: Context, client: FlaskClient, started: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every work page asks for its state every few seconds; the hub's health in it is one
    reading shared by the portal's requests (`infra.hub.health`), not a request to the hub per
    poll (each of which, with the hub down, held a portal thread for the 3 s timeout)."""
    hub = ThreadingHTTPServer(("127.0.0.1", 0), _CountingHub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("BASELINE_HUB_PUBLIC_URL", f"http://127.0.0.1:{hub.server_port}")
        _login(client, started.email)
        polls = [_work_state(client, started.attempt_id) for _ in range(6)]
        assert all(state["hub_up"] for state in polls)
        assert _CountingHub.asked in (1, 2)  # 2 only if the polls outlived one reading's 2 s
    finally:
        hub.shutdown()
        hub.server_close()
