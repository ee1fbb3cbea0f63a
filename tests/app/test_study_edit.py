"""The study's edit page and the API's PATCH (issue 40 item 5): settings editable until the first
attempt starts, only labels and the hourly rate after; refusals are 4xx with the reason."""

from __future__ import annotations

import re

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select

from baseline.context import Context
from baseline.models import Attempt, AuditEvent, Role, Study, utcnow
from baseline.people import accounts
from baseline.studies import studies
from baseline.tasks import tasks
from tests.app.html_form import form_fields
from tests.conftest import Users, json_of, login

pytestmark = pytest.mark.sqlite_only("the portal's forms and answers, not the storage")


def _study(ctx: Context) -> tuple[int, int]:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Edited"), None)
        task = tasks.import_demo_tasks(session, ctx.settings)[0]
        studies.add_task(session, study, task, None)
        agent = studies.add_agent(session, study, "A", "basic", "m", "", {}, None)
        return study.id, studies.create_attempt(session, agent, task, None).id


def _start(ctx: Context, attempt_id: int) -> None:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.started_at = utcnow()


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found
    return found.group(1)


def _stored(ctx: Context, study_id: int) -> Study:
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        session.expunge(study)
        return study


def test_the_edit_page_changes_settings_until_the_first_start_then_only_labels(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    study_id, attempt_id = _study(ctx)
    login(client, users[Role.COORDINATOR].email)
    detail = client.get(f"/studies/{study_id}").get_data(as_text=True)
    assert f'href="/studies/{study_id}/edit"' in detail
    page = client.get(f"/studies/{study_id}/edit").get_data(as_text=True)
    assert 'value="2, 8, 32, 48"' in page and "disabled" not in page
    form = {"csrf_token": _csrf(page), "name": "Edited", "description": "",
            "hardware_profile": "cpu", "checkpoint_hours": "1, 3",
            "working_time_limit_hours": "4", "wall_clock_limit_hours": "",
            "snapshot_interval_minutes": "", "idle_pause_minutes": "20", "time_scale": "1",
            "reproduction_timeout_minutes": "720", "human_hourly_rate_usd": "0",
            "egress_policy": "blacklist", "snapshot_policy": "baseline"}  # fmt: skip
    saved = client.post(f"/studies/{study_id}/edit", data=form)
    assert saved.status_code == 303
    study = _stored(ctx, study_id)
    assert study.checkpoint_hours == [1.0, 3.0] and study.working_time_limit_hours == 4.0
    assert study.idle_pause_minutes == 20.0
    # A bad value is shown on the form, nothing stored.
    bad = client.post(f"/studies/{study_id}/edit", data={**form, "checkpoint_hours": "3, 1"})
    assert bad.status_code == 422 and "strictly increasing" in bad.get_data(as_text=True)
    assert 'value="3, 1"' in bad.get_data(as_text=True)

    _start(ctx, attempt_id)
    page = client.get(f"/studies/{study_id}/edit").get_data(as_text=True)
    assert f'Attempt <a href="/attempts/{attempt_id}">{attempt_id}</a> has started' in page
    assert re.search(r'id="checkpoint_hours"[^>]*disabled', page)
    assert not re.search(r'id="name"[^>]*disabled', page)
    refused = client.post(f"/studies/{study_id}/edit", data={**form, "checkpoint_hours": "2, 8"})
    assert refused.status_code == 409
    assert f"checkpoint_hours: fixed since attempt {attempt_id} started" in refused.get_data(
        as_text=True
    )
    # What the page sends once fields are disabled: the label fields only.
    renamed = client.post(
        f"/studies/{study_id}/edit",
        data={"csrf_token": form["csrf_token"], "name": "Renamed", "description": "why",
              "human_hourly_rate_usd": "30"},
    )  # fmt: skip
    assert renamed.status_code == 303
    study = _stored(ctx, study_id)
    assert (study.name, study.human_hourly_rate_usd) == ("Renamed", 30.0)
    assert study.checkpoint_hours == [1.0, 3.0]
    with ctx.session() as session:
        edits = session.scalars(select(AuditEvent).where(AuditEvent.action == "study.edit")).all()
    assert [sorted(e.details["changes"]) for e in edits] == [
        ["checkpoint_hours", "idle_pause_minutes", "working_time_limit_hours"],
        ["description", "human_hourly_rate_usd", "name"],
    ]
    assert all(e.actor_id == users[Role.COORDINATOR].id for e in edits)


@pytest.mark.parametrize("role", [Role.GRADER, Role.ANALYST, Role.PARTICIPANT])
def test_only_staff_edit_a_study(
    ctx: Context, client: FlaskClient, users: Users, role: Role
) -> None:
    study_id, _ = _study(ctx)
    login(client, users[role].email)
    assert client.get(f"/studies/{study_id}/edit").status_code in (403, 404)


def _coordinator_api(ctx: Context, users: Users) -> dict[str, str]:
    """The headers of a coordinator's API calls."""
    with ctx.session() as session:
        token = accounts.issue_token(session, session.merge(users[Role.COORDINATOR]), "t")
    return {"Authorization": f"Bearer {token}"}


def test_the_api_patches_settings_with_the_same_rules(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    study_id, attempt_id = _study(ctx)
    headers = _coordinator_api(ctx, users)
    url = f"/api/v1/studies/{study_id}"
    ok = client.patch(url, json={"checkpoint_hours": [4, 12], "status": "active"}, headers=headers)
    assert ok.status_code == 200, ok.get_data(as_text=True)
    assert json_of(ok)["checkpoint_hours"] == [4.0, 12.0] and json_of(ok)["status"] == "active"
    assert client.patch(url, json={}, headers=headers).status_code == 422
    assert client.patch(url, json={"time_scale": -1}, headers=headers).status_code == 422
    _start(ctx, attempt_id)
    refused = client.patch(url, json={"working_time_limit_hours": 1}, headers=headers)
    assert refused.status_code == 409
    assert "fixed since attempt" in json_of(refused)["message"]
    renamed = client.patch(url, json={"name": "Via API"}, headers=headers)
    assert renamed.status_code == 200 and json_of(renamed)["name"] == "Via API"
    assert _stored(ctx, study_id).working_time_limit_hours == 48.0


def test_two_api_clients_changing_a_study_from_one_read_do_not_undo_each_other(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    study_id, _ = _study(ctx)
    headers = _coordinator_api(ctx, users)
    url = f"/api/v1/studies/{study_id}"
    read = client.get(url, headers=headers)
    tag = read.headers["ETag"]
    assert client.get(url, headers=headers).headers["ETag"] == tag  # the same study, the same tag
    archived = client.patch(url, json={"status": "archived"}, headers={**headers, "If-Match": tag})
    assert archived.status_code == 200 and archived.headers["ETag"] != tag
    # the other client read the study before: its change is refused, nothing changed
    stale = client.patch(url, json={"status": "closed"}, headers={**headers, "If-Match": tag})
    assert stale.status_code == 412, stale.get_data(as_text=True)
    assert json_of(stale)["error"] == "precondition_failed"
    assert archived.headers["ETag"] in json_of(stale)["message"]
    assert _stored(ctx, study_id).status.value == "archived"
    fresh = client.get(url, headers=headers)
    assert fresh.headers["ETag"] == archived.headers["ETag"]
    closed = client.patch(
        url, json={"status": "closed"}, headers={**headers, "If-Match": fresh.headers["ETag"]}
    )
    assert closed.status_code == 200 and json_of(closed)["status"] == "closed"
    # without If-Match a change is made as before
    assert client.patch(url, json={"name": "Renamed"}, headers=headers).status_code == 200


def _opened(client: FlaskClient, study_id: int) -> dict[str, str]:
    return form_fields(client.get(f"/studies/{study_id}/edit").get_data(as_text=True))


def test_two_coordinators_editing_at_once_lose_neither_change(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    """The second to save wrote back every value of the form they had opened: the first one's
    new time limit went back to 48 h, unseen, with an audit entry saying the second changed it."""
    study_id, _ = _study(ctx)
    login(client, users[Role.COORDINATOR].email)
    first, second = _opened(client, study_id), _opened(client, study_id)
    assert first["shown_working_time_limit_hours"] == "48"
    saved = client.post(
        f"/studies/{study_id}/edit", data={**first, "working_time_limit_hours": "10"}
    )
    assert saved.status_code == 303
    saved = client.post(
        f"/studies/{study_id}/edit", data={**second, "description": "pilot, second round"}
    )
    assert saved.status_code == 303
    study = _stored(ctx, study_id)
    assert (study.working_time_limit_hours, study.description) == (10.0, "pilot, second round")
    # Both changed the same setting: the later one is refused, saying what it is now.
    clash = client.post(
        f"/studies/{study_id}/edit",
        data={**second, "working_time_limit_hours": "6", "name": "Renamed"},
    )
    assert clash.status_code == 409
    assert (
        "working time limit hours (now 10): changed by someone else since you opened this form"
        in clash.get_data(as_text=True)
    )
    study = _stored(ctx, study_id)
    assert (study.working_time_limit_hours, study.name) == (10.0, "Edited")
    # The refused form shows the settings as they are now (the first one's description too)
    # with this one's changes over them: saved again, knowingly, it writes them.
    refused = form_fields(clash.get_data(as_text=True))
    assert (refused["working_time_limit_hours"], refused["name"]) == ("6", "Renamed")
    assert refused["shown_working_time_limit_hours"] == "10"
    assert refused["description"] == refused["shown_description"] == "pilot, second round"
    again = client.post(f"/studies/{study_id}/edit", data=refused)
    assert again.status_code == 303
    study = _stored(ctx, study_id)
    assert (study.working_time_limit_hours, study.name) == (6.0, "Renamed")
    assert study.description == "pilot, second round"
    with ctx.session() as session:
        edits = session.scalars(select(AuditEvent).where(AuditEvent.action == "study.edit")).all()
    assert [sorted(e.details["changes"]) for e in edits] == [
        ["working_time_limit_hours"],
        ["description"],
        ["name", "working_time_limit_hours"],
    ]


def test_a_status_chosen_on_a_stale_page_does_not_undo_a_newer_one(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    study_id, _ = _study(ctx)
    login(client, users[Role.COORDINATOR].email)
    url = f"/studies/{study_id}/status"
    opened = form_fields(client.get(f"/studies/{study_id}").get_data(as_text=True), url)
    assert opened["shown_status"] == "draft"
    # someone else archives the study; this page, opened before, then closes it
    archived = client.post(url, data={**opened, "status": "archived"}, follow_redirects=True)
    assert "Study is now archived" in archived.get_data(as_text=True)
    stale = client.post(url, data={**opened, "status": "closed"}, follow_redirects=True)
    page = stale.get_data(as_text=True)
    assert "Study is archived now, not draft as when you opened the page" in page
    assert _stored(ctx, study_id).status.value == "archived"
    # the page as it is now offers what it shows; the same status again changes nothing
    fresh = form_fields(page, url)
    assert fresh["shown_status"] == "archived"
    same = client.post(url, data={**fresh, "status": "archived"}, follow_redirects=True)
    assert "Study is archived already: nothing changed." in same.get_data(as_text=True)
    closed = client.post(url, data={**fresh, "status": "closed"}, follow_redirects=True)
    assert "Study is now closed" in closed.get_data(as_text=True)
    with ctx.session() as session:
        changes = session.scalars(
            select(AuditEvent).where(AuditEvent.action == "study.status")
        ).all()
        assert [e.details["now"] for e in changes] == ["archived", "closed"]
