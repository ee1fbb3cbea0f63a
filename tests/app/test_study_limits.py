"""Issue 39 item 6: the studies list and a study's page show the limit the attempts really have
(an attempt keeps the limit it was created with, plus extensions), with the study's default
labelled as such, never "Limit 8 h" beside a 120 h attempt."""

from __future__ import annotations

import re

import pytest
from flask.testing import FlaskClient

from baseline.context import Context
from baseline.models import Role
from baseline.people import accounts
from baseline.studies import studies
from baseline.tasks import tasks
from tests.conftest import PASSWORD, Users, login

pytestmark = pytest.mark.sqlite_only("the portal's pages, not the storage")


def _study(ctx: Context, name: str, attempt_hours: list[float], email: str = "") -> int:
    """A study with the default limit of 8 h and one human attempt per limit given."""
    with ctx.session() as session:
        study = studies.create_study(
            session, studies.StudySpec(name=name, working_time_limit_hours=8.0), None
        )
        task = tasks.import_demo_tasks(session, ctx.settings)[0]
        studies.add_task(session, study, task, None)
        for n, hours in enumerate(attempt_hours):
            user = accounts.create_user(
                session, email or f"{name}-{n}@test.example", "P", PASSWORD, Role.PARTICIPANT
            )
            attempt = studies.create_attempt(
                session, studies.enroll_human(session, study.id, user, None), task, None
            )
            attempt.working_time_limit_s = hours * 3600
        return study.id


def _limit_cell(page: str, study_id: int) -> list[str]:
    row = re.search(rf'href="/studies/{study_id}">.*?<td class="limit">(.*?)</td>', page, re.S)
    assert row, page
    return re.sub(r"<[^>]+>", " ", row.group(1)).split()


def test_the_limit_shown_is_the_attempts_own(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    extended = _study(ctx, "live", [120.0], email="mine@test.example")
    usual = _study(ctx, "usual", [8.0, 8.0])
    empty = _study(ctx, "empty", [])
    login(client, users[Role.COORDINATOR].email)
    listing = client.get("/studies/").get_data(as_text=True)
    assert " ".join(_limit_cell(listing, extended)) == "120 h the attempts' own; study default 8 h"
    assert " ".join(_limit_cell(listing, usual)) == "8 h"
    assert " ".join(_limit_cell(listing, empty)) == "8 h study default"

    page = client.get(f"/studies/{extended}").get_data(as_text=True)
    card = re.search(r'<div class="card" id="limit">(.*?)</div>\s*<div class="card">', page, re.S)
    assert card, page
    text = " ".join(re.sub(r"<[^>]+>", " ", card.group(1)).split())
    assert text.startswith("Working-time limit of the attempts 120 h study default 8 h"), text
    assert re.search(r'<td class="limit">120 h</td>', page)  # the attempt's row

    # The participant of the extended attempt sees the same on their own list.
    client.post("/logout")
    login(client, "mine@test.example")
    mine = client.get("/studies/").get_data(as_text=True)
    assert _limit_cell(mine, extended)[:2] == ["120", "h"]


def test_a_time_scaled_study_says_so_beside_its_limit(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    """The time scale read as a note on the internet access card."""
    with ctx.session() as session:
        spec = studies.StudySpec(name="scaled", working_time_limit_hours=8.0, time_scale=3600)
        study_id = studies.create_study(session, spec, None).id
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    card = re.search(r'<div class="card" id="limit">(.*?)</div>\s*<div class="card">', page, re.S)
    assert card, page
    text = " ".join(re.sub(r"<[^>]+>", " ", card.group(1)).split())
    scale = "time-scaled: one second of real time counts as 1 h of working time"
    assert text.endswith(scale), text
    assert page.count("time-scaled") == 1
