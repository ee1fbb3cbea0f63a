"""Fuzzing the HTML routes' query strings: bad input is a 4xx with a message, never a 500.

The API is fuzzed from its OpenAPI document (test_api_schemathesis.py); the HTML pages have no
such document, so the parameter names are read from the blueprints' source (every
`request.args.get("name"...)`) and hypothesis draws values for them, plus names nobody reads.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.routing import Rule

from baseline.models import Role
from tests.app.test_access_matrix import FRAMEWORK_ENDPOINTS, World, world  # noqa: F401
from tests.conftest import Users, login

BLUEPRINTS = Path(__file__).resolve().parents[2] / "app" / "blueprints"
ARG_NAMES = sorted(
    {
        name
        for source in BLUEPRINTS.glob("*.py")
        for name in re.findall(
            r"request\.args\.(?:get|getlist)\(\s*\"([^\"]+)\"", source.read_text()
        )
    }
)
NASTY = [
    "",
    "0",
    "-1",
    "99999999999999999999",
    "-99999999999999999999",
    str(2**63),
    "1e308",
    "nan",
    "inf",
    "1.5",
    " 1",
    "../../etc/passwd",
    "a" * 2000,
    "%00",
    "\x00",
    "☃",
]
SKIPPED = {"auth.logout"}


def _get_rules(app: Flask) -> list[Rule]:
    return sorted(
        (
            r
            for r in app.url_map.iter_rules()
            if "GET" in (r.methods or set())
            and r.endpoint not in FRAMEWORK_ENDPOINTS | SKIPPED
            and not r.rule.startswith("/api/")
        ),
        key=lambda r: r.rule,
    )


def _paths(app: Flask, world: World) -> list[str]:  # noqa: F811
    with app.test_request_context():
        return [
            app.url_for(rule.endpoint, **world.path_values(rule))  # type: ignore[arg-type]
            for rule in _get_rules(app)
        ]


@pytest.fixture
def admin_client(app: Flask, users: Users) -> FlaskClient:
    app.config["WTF_CSRF_ENABLED"] = False
    client = app.test_client()
    login(client, users[Role.ADMIN].email)
    return client


def _check(client: FlaskClient, path: str, query: list[tuple[str, str]]) -> None:
    response = client.get(path, query_string=query)
    assert response.status_code < 500, f"{path}?{query}: {response.status_code}"
    if response.status_code >= 400:
        body = response.get_data(as_text=True)
        assert re.search(r"<p[^>]*>[^<]{3,}", body) or response.is_json, (
            f"{path}?{query}: {response.status_code} without a message"
        )


def test_query_parameters_are_known() -> None:
    assert {"study", "snapshot", "path", "a", "b", "grading"} <= set(ARG_NAMES)


def test_every_route_with_every_nasty_value(
    app: Flask,
    admin_client: FlaskClient,
    world: World,  # noqa: F811
) -> None:
    """Deterministic sweep: each GET page, each known parameter, each nasty value."""
    for path in _paths(app, world):
        for name in ARG_NAMES:
            for value in NASTY:
                _check(admin_client, path, [(name, value)])


values = st.one_of(
    st.sampled_from(NASTY),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30),
)
names = st.one_of(st.sampled_from(ARG_NAMES), st.text(min_size=1, max_size=8))


def test_random_query_strings_on_every_route(
    app: Flask,
    admin_client: FlaskClient,
    world: World,  # noqa: F811
) -> None:
    paths = _paths(app, world)

    @given(
        path=st.sampled_from(paths),
        query=st.lists(st.tuples(names, values), max_size=5),
    )
    @settings(
        max_examples=300,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def check(path: str, query: list[tuple[str, str]]) -> None:
        _check(admin_client, path, query)

    check()
