"""Fuzzing the HTML routes' query strings: bad input is a 4xx with a message, never a 500.

The API is fuzzed from its OpenAPI document (test_api_schemathesis.py); the HTML pages have no
such document, so the parameter names are read from the blueprints' source (every
`request.args.get("name"...)`) and hypothesis draws values for them, plus names nobody reads.

The deterministic sweep sends each page each parameter alone. A page that did not look at the
parameter (request.args records its look-ups, see _RecordingArgs) cannot treat its other values
differently, since nothing else in the query can steer it: the sweep moves on to the next name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from flask import Flask, Request
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from werkzeug.datastructures import ImmutableMultiDict
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
# What PostgreSQL refuses where SQLite does not, or refuses otherwise: NUL bytes in text, integers
# past 64 bits, strings longer than a column's length, non-ASCII. The sweep on PostgreSQL sends
# these only; the SQLite sweep sends every value (the others are parsed or refused in Python
# before any query, alike on both engines).
ENGINE_SENSITIVE = ["\x00", "99999999999999999999", str(2**63), "a" * 2000, "☃"]
SKIPPED = {"auth.logout"}
EVERY_NAME = "*"


class _RecordingArgs(ImmutableMultiDict[str, str]):
    """`request.args` that notes each name a view looks up, and EVERY_NAME when it looks at all
    of them (iterates, copies, counts). One test client answers one request at a time."""

    read: ClassVar[set[str]] = set()


def _noting_key(method: Callable[..., Any]) -> Callable[..., Any]:
    def lookup(self: _RecordingArgs, key: str, *args: Any, **kwargs: Any) -> Any:
        _RecordingArgs.read.add(key)
        return method(self, key, *args, **kwargs)

    return lookup


def _noting_all(method: Callable[..., Any]) -> Callable[..., Any]:
    def wholesale(self: _RecordingArgs, *args: Any, **kwargs: Any) -> Any:
        _RecordingArgs.read.add(EVERY_NAME)
        return method(self, *args, **kwargs)

    return wholesale


for _name in ("get", "getlist", "__getitem__", "__contains__"):
    setattr(_RecordingArgs, _name, _noting_key(getattr(ImmutableMultiDict, _name)))
for _name in (
    "items", "keys", "values", "lists", "listvalues", "to_dict", "copy", "__iter__", "__len__",
    "__eq__", "__repr__", "__reduce_ex__", "__copy__", "__deepcopy__",
):  # fmt: skip
    setattr(_RecordingArgs, _name, _noting_all(getattr(ImmutableMultiDict, _name)))


class _RecordingRequest(Request):
    """A request whose query string counts as read in full when a view reads its URL."""

    parameter_storage_class = _RecordingArgs

    @property
    def full_path(self) -> str:
        _RecordingArgs.read.add(EVERY_NAME)
        return super().full_path

    @property
    def url(self) -> str:
        _RecordingArgs.read.add(EVERY_NAME)
        return super().url


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
    app.request_class = _RecordingRequest
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
    database_url: str,
) -> None:
    """Deterministic sweep: each GET page, each known parameter, each nasty value it reads."""
    nasty = ENGINE_SENSITIVE if database_url.startswith("postgresql") else NASTY
    looked_at: set[str] = set()
    for path in _paths(app, world):
        for name in ARG_NAMES:
            for value in nasty:
                _RecordingArgs.read.clear()
                _check(admin_client, path, [(name, value)])
                if not _RecordingArgs.read & {name, EVERY_NAME}:
                    break  # the page never looked at `name`: any value takes this same path
                looked_at.add(name)
    # The recording sees the look-ups: every name the blueprints read is read by some page.
    assert looked_at == set(ARG_NAMES), sorted(set(ARG_NAMES) - looked_at)


values = st.one_of(
    st.sampled_from(NASTY),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30),
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
