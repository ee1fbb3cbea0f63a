"""The portal's template filters and error pages: numbers as people write them, a way on."""

from __future__ import annotations

from flask import Flask
from flask.testing import FlaskClient

from baseline.models import Role
from tests.conftest import Users, login


def test_numbers_are_shown_as_people_write_them_and_never_as_minus_zero(app: Flask) -> None:
    """A score an older Baseline stored as -0.0 (a lower-is-better task's exact start) showed
    as "-0"; it is 0, as the start is by construction."""
    num = app.jinja_env.filters["num"]
    assert [num(v) for v in (-0.0, 0, 2.0, 0.25, -0.5, None)] == ["0", "0", "2", "0.25", "-0.5", ""]


def test_an_error_page_leads_back_where_its_reader_can_go(
    client: FlaskClient, users: Users
) -> None:
    """Its one link read "Back", to the login page for someone who had never been there."""
    outside = client.get("/no-such-page").get_data(as_text=True)
    assert '<a href="/login">Log in</a>' in outside
    login(client, users[Role.COORDINATOR].email)
    missing = client.get("/studies/999999")
    assert missing.status_code == 404
    assert '<a href="/studies/">Back to your studies</a>' in missing.get_data(as_text=True)
