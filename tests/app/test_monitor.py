"""The monitor page, its board (ETag / 304), settings and acknowledging, in the portal and under
/api/v1: coordinators and admins only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from baseline.attempts import attempts
from baseline.context import Context
from baseline.models import Attempt, ModelCall, PauseReason, Role
from baseline.monitor import alerts, board
from baseline.people import accounts
from tests.app.html_form import form_fields
from tests.baseline.attempt_world import directory_resolver, make_attempt
from tests.conftest import Users, json_of, login


@pytest.fixture
def running(ctx: Context, tmp_path: Path) -> tuple[int, int]:
    """(study id, attempt id) of a started agent attempt."""
    attempt_id = make_attempt(ctx)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path))
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        return attempt.study_id, attempt_id


def _bearer(app: Flask, users: Users, role: Role) -> dict[str, str]:
    with app.extensions["baseline"].session() as session:
        token = accounts.issue_token(session, session.merge(users[role]), "t")
    return {"Authorization": f"Bearer {token}"}


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found
    return found.group(1)


@pytest.mark.sqlite_only("the role check and the acknowledge flow, not the storage")
@pytest.mark.parametrize("role", [Role.GRADER, Role.ANALYST, Role.PARTICIPANT])
def test_only_coordinators_and_admins_see_the_monitor(
    app: Flask, client: FlaskClient, users: Users, running: tuple[int, int], role: Role
) -> None:
    study_id, _ = running
    login(client, users[role].email)
    assert client.get(f"/studies/{study_id}/monitor").status_code == 403
    assert client.get(f"/studies/{study_id}/monitor/board").status_code == 403
    api = client.get(f"/api/v1/studies/{study_id}/monitor", headers=_bearer(app, users, role))
    assert api.status_code == 403 and json_of(api)["error"] == "forbidden"


def test_the_page_links_from_the_study_and_carries_the_board(
    client: FlaskClient, users: Users, running: tuple[int, int]
) -> None:
    study_id, attempt_id = running
    login(client, users[Role.COORDINATOR].email)
    assert f"/studies/{study_id}/monitor" in client.get(f"/studies/{study_id}").get_data(
        as_text=True
    )
    page = client.get(f"/studies/{study_id}/monitor")
    assert page.status_code == 200
    text = page.get_data(as_text=True)
    embedded = re.search(r'<script type="application/json" id="board-data">(.*?)</script>', text)
    assert embedded is not None
    assert [a["id"] for a in json.loads(embedded.group(1))["attempts"]] == [attempt_id]
    assert client.get("/studies/monitor.js").mimetype == "application/javascript"
    assert client.get("/studies/999/monitor").status_code == 404


def test_the_board_answers_304_until_something_changes(
    app: Flask,
    client: FlaskClient,
    users: Users,
    running: tuple[int, int],
    ctx: Context,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One bucket of wall time for the whole test: the version changes every 30 s by design, and
    # two requests that fell on either side of a bucket's end answered 200 (a flaky failure).
    monkeypatch.setattr(board, "VERSION_BUCKET_S", 10**9)
    study_id, attempt_id = running
    auth = _bearer(app, users, Role.COORDINATOR)
    first = client.get(f"/api/v1/studies/{study_id}/monitor", headers=auth)
    assert first.status_code == 200 and first.headers["ETag"]
    body = json_of(first)
    assert [a["id"] for a in body["attempts"]] == [attempt_id]
    assert body["attempts"][0]["clock"] == "running"
    tag = first.headers["ETag"]
    again = client.get(
        f"/api/v1/studies/{study_id}/monitor", headers={**auth, "If-None-Match": tag}
    )
    assert again.status_code == 304 and again.get_data() == b""
    attempts.pause(ctx, attempt_id, PauseReason.ADMIN, None, "power cut")
    changed = client.get(
        f"/api/v1/studies/{study_id}/monitor", headers={**auth, "If-None-Match": tag}
    )
    assert changed.status_code == 200 and changed.headers["ETag"] != tag
    row = json_of(changed)["attempts"][0]
    assert row["clock"] == "paused" and row["pause_reason"] == "admin"
    assert row["pauses"][-1]["note"] == "power cut"
    # the portal's own board (session login) is the same data with the same tag
    login(client, users[Role.COORDINATOR].email)
    portal = client.get(f"/studies/{study_id}/monitor/board")
    assert portal.headers["ETag"] == changed.headers["ETag"]


def test_two_api_clients_replacing_the_settings_do_not_undo_each_other_with_if_match(
    app: Flask, client: FlaskClient, users: Users, running: tuple[int, int]
) -> None:
    study_id, _ = running
    auth = _bearer(app, users, Role.COORDINATOR)
    url = f"/api/v1/studies/{study_id}/monitor/settings"
    read = client.get(url, headers=auth)
    tag = read.headers["ETag"]
    first = {**json_of(read), "budget_usd": 40}
    first.pop("webhook_secret")
    saved = client.put(url, headers={**auth, "If-Match": tag}, json=first)
    assert saved.status_code == 200 and saved.headers["ETag"] != tag
    # the second client read the settings before the first saved: its replace is refused
    second = {**first, "budget_usd": None, "thresholds": {**first["thresholds"], "idle_minutes": 5}}
    stale = client.put(url, headers={**auth, "If-Match": tag}, json=second)
    assert stale.status_code == 412, stale.get_data(as_text=True)
    problem = json_of(stale)
    assert problem["error"] == "precondition_failed"
    assert "changed since you read them" in problem["message"]
    assert saved.headers["ETag"].strip('"') in problem["message"]
    assert json_of(client.get(url, headers=auth))["budget_usd"] == 40  # nothing was saved
    # read again, changed again: saved, keeping the first client's budget
    fresh = client.get(url, headers=auth)
    assert fresh.headers["ETag"] == saved.headers["ETag"]
    second["budget_usd"] = json_of(fresh)["budget_usd"]
    again = client.put(url, headers={**auth, "If-Match": fresh.headers["ETag"]}, json=second)
    assert again.status_code == 200
    assert (json_of(again)["budget_usd"], json_of(again)["thresholds"]["idle_minutes"]) == (40, 5)
    # without If-Match a PUT replaces the settings as before; "*" matches any version
    assert client.put(url, headers={**auth, "If-Match": "*"}, json=second).status_code == 200
    assert client.put(url, headers=auth, json={}).status_code == 200
    assert json_of(client.get(url, headers=auth))["budget_usd"] is None


def test_settings_through_the_api_and_the_form_with_clear_errors(
    app: Flask, client: FlaskClient, users: Users, running: tuple[int, int]
) -> None:
    study_id, _ = running
    auth = _bearer(app, users, Role.COORDINATOR)
    url = f"/api/v1/studies/{study_id}/monitor/settings"
    saved = client.put(
        url,
        headers=auth,
        json={
            "budget_usd": 50,
            "thresholds": {"idle_minutes": 15, "queue_minutes": None},
            "email_to": ["coord@test.example"],
            "webhook_url": "https://hooks.test.example/baseline",
        },
    )
    assert saved.status_code == 200, saved.get_data(as_text=True)
    body = json_of(saved)
    assert body["budget_usd"] == 50 and body["thresholds"]["idle_minutes"] == 15
    assert body["thresholds"]["queue_minutes"] is None and len(body["webhook_secret"]) == 64
    bad = client.put(url, headers=auth, json={"email_to": ["not-an-address"]})
    assert bad.status_code == 422 and "not an e-mail address" in json_of(bad)["message"]
    assert (
        client.put(url, headers=auth, json={"thresholds": {"failure_rate": 3}}).status_code == 422
    )

    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}/monitor").get_data(as_text=True)
    refused = client.post(
        f"/studies/{study_id}/monitor/settings",
        data={"csrf_token": _csrf(page), "idle_minutes": "ten"},
    )
    assert refused.status_code == 422
    assert "idle minutes: not a number: &#39;ten&#39;" in refused.get_data(as_text=True)
    ok = client.post(
        f"/studies/{study_id}/monitor/settings",
        data={
            "csrf_token": _csrf(page),
            "idle_minutes": "20",
            "host_down": "on",
            "budget_usd": "5",
        },
    )
    assert ok.status_code == 303
    after = json_of(client.get(url, headers=auth))
    assert after["thresholds"]["idle_minutes"] == 20 and after["thresholds"]["host_down"] is True
    assert after["thresholds"]["workspace_dead"] is False  # its box was left unticked
    # A field the form did not send is left as it is, as on the study's edit form.
    assert after["budget_usd"] == 5 and after["email_to"] == ["coord@test.example"]


def _settings_form(client: FlaskClient, study_id: int) -> dict[str, str]:
    page = client.get(f"/studies/{study_id}/monitor").get_data(as_text=True)
    return form_fields(page, f"/studies/{study_id}/monitor/settings")


@pytest.mark.sqlite_only("the settings form's answers, not the storage")
def test_two_coordinators_saving_the_settings_at_once_lose_neither_change(
    app: Flask, client: FlaskClient, users: Users, running: tuple[int, int]
) -> None:
    """The form sent every threshold as it had shown it: the second to save wrote back the
    idle threshold and the host-down box the first had just changed, unseen."""
    study_id, _ = running
    login(client, users[Role.COORDINATOR].email)
    first, second = _settings_form(client, study_id), _settings_form(client, study_id)
    assert (first["shown_idle_minutes"], first["host_down"]) == ("60", "on")
    url = f"/studies/{study_id}/monitor/settings"
    unticked = {name: value for name, value in first.items() if name != "host_down"}
    saved = client.post(url, data={**unticked, "idle_minutes": "15"})
    assert saved.status_code == 303
    saved = client.post(url, data={**second, "budget_usd": "40"})
    assert saved.status_code == 303
    auth = _bearer(app, users, Role.COORDINATOR)
    stored = json_of(client.get(f"/api/v1/studies/{study_id}/monitor/settings", headers=auth))
    assert stored["budget_usd"] == 40
    assert (stored["thresholds"]["idle_minutes"], stored["thresholds"]["host_down"]) == (15, False)
    # Both changed the same threshold: the later save is refused, saying what it is now, and
    # the form keeps what was typed.
    clash = client.post(url, data={**second, "idle_minutes": "5", "webhook_url": "x"})
    assert clash.status_code == 409
    page = clash.get_data(as_text=True)
    assert "idle minutes (now 15): changed by someone else since you opened this form" in page
    refused = form_fields(page, url)
    assert (refused["idle_minutes"], refused["webhook_url"]) == ("5", "x")
    boxes = client.post(url, data={name: v for name, v in second.items() if name != "host_down"})
    assert boxes.status_code == 409 and "host down (now off)" in boxes.get_data(as_text=True)
    again = json_of(client.get(f"/api/v1/studies/{study_id}/monitor/settings", headers=auth))
    assert again == stored
    # The refused form shows the settings as they are now (the other's host-down box, off) with
    # this one's changes over them: saved again (its webhook made valid), they are written.
    assert (refused["shown_idle_minutes"], "host_down" in refused) == ("15", False)
    refused["webhook_url"] = "https://hooks.test.example/b"
    assert client.post(url, data=refused).status_code == 303
    final = json_of(client.get(f"/api/v1/studies/{study_id}/monitor/settings", headers=auth))
    assert (final["thresholds"]["idle_minutes"], final["thresholds"]["host_down"]) == (5, False)
    assert (final["budget_usd"], final["webhook_url"]) == (40, "https://hooks.test.example/b")


@pytest.mark.sqlite_only("the role check and the acknowledge flow, not the storage")
def test_an_alert_is_acknowledged_in_the_portal_and_shown_with_its_deliveries(
    app: Flask, client: FlaskClient, users: Users, running: tuple[int, int], ctx: Context
) -> None:
    study_id, attempt_id = running
    auth = _bearer(app, users, Role.COORDINATOR)
    client.put(
        f"/api/v1/studies/{study_id}/monitor/settings",
        headers=auth,
        json={"budget_usd": 1, "thresholds": {"spend_share": 0.5}},
    )
    with ctx.session() as session:
        session.add(
            ModelCall(
                study_id=study_id, attempt_id=attempt_id, purpose="agent", model="m", cost_usd=0.7
            )
        )
    [alert_id] = alerts.evaluate_and_deliver(ctx, study_id).fired
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}/monitor").get_data(as_text=True)
    url = f"/studies/{study_id}/monitor/alerts/{alert_id}/acknowledge"
    assert client.post(url, data={"csrf_token": _csrf(page)}).status_code == 303
    again = client.post(url, data={"csrf_token": _csrf(page)})
    assert again.status_code == 409 and "acknowledged already" in again.get_data(as_text=True)
    assert (
        client.post(
            f"/studies/{study_id}/monitor/alerts/9999/acknowledge", data={"csrf_token": _csrf(page)}
        ).status_code
        == 404
    )
    shown = json_of(client.get(f"/api/v1/studies/{study_id}/alerts/{alert_id}", headers=auth))
    assert shown["rule"] == "spend" and shown["acknowledged_by"] == users[Role.COORDINATOR].name
    assert shown["deliveries"] == []  # no recipients set
    api_again = client.post(
        f"/api/v1/studies/{study_id}/alerts/{alert_id}/acknowledge", headers=auth
    )
    assert api_again.status_code == 409
