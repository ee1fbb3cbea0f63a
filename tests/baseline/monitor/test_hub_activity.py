"""The monitor's last activity of a human in JupyterHub: the hub's own record, read by the 30 s
evaluation job (one listing for every server) and never by a board; when the hub does not
answer, the board and the idle alert say so.

A fake hub (its user listing and nothing else) stands in for JupyterHub: what is checked is what
the monitor does with the hub's answers, not the hub.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select

from baseline.attempts import attempts
from baseline.cli import main
from baseline.context import Context
from baseline.models import Alert, AlertRule, Attempt, HubLoginToken, Role, utcnow
from baseline.monitor import alerts
from baseline.people import accounts
from tests.baseline.attempt_world import directory_resolver, make_attempt
from tests.conftest import Users
from tests.ports import free_port

pytestmark = pytest.mark.sqlite_only


@dataclass
class FakeHub:
    """The hub's `GET /hub/api/users?state=active` with `servers`, paged as the hub pages it."""

    url: str = ""
    # (hub user, server name) -> last_activity as the hub records it
    servers: dict[tuple[str, str], datetime] = field(default_factory=dict)
    failing: bool = False
    requests: list[str] = field(default_factory=list)

    def users(self) -> list[dict[str, Any]]:
        by_user: dict[str, dict[str, Any]] = {}
        for (user, server), when in sorted(self.servers.items()):
            record = by_user.setdefault(user, {"name": user, "servers": {}})
            record["servers"][server] = {"ready": True, "last_activity": when.isoformat()}
        return list(by_user.values())


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    fake = FakeHub()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fake.requests.append(self.path)
            parsed = urlparse(self.path)
            query = parse_qs(parsed.query)
            if fake.failing or parsed.path != "/hub/api/users" or query.get("state") != ["active"]:
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            offset, limit = int(query["offset"][0]), int(query["limit"][0])
            body = json.dumps(fake.users()[offset : offset + limit]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("BASELINE_HUB_PUBLIC_URL", fake.url)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield fake
    server.shutdown()
    server.server_close()


def _terminal_worker(ctx: Context, tmp_path: Path, started: datetime) -> tuple[int, int, int]:
    """A human attempt started, logged into the hub and resumed at `started`, with nothing
    recorded by Baseline since: (attempt, its participant's user, study)."""
    attempt_id = make_attempt(ctx, human=True, time_scale=1.0)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path), now=started)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.participant.user_id is not None
        user_id, study_id = attempt.participant.user_id, attempt.study_id
        token = f"{attempt_id:064d}"
        session.add(
            HubLoginToken(
                token_hash=token, user_id=user_id, attempt_id=attempt_id, expires_at=started,
                used_at=started,
            )
        )  # fmt: skip
    assert attempts.first_login(ctx, attempt_id, user_id, now=started)
    return attempt_id, user_id, study_id


def _board_row(client: FlaskClient, ctx: Context, users: Users, study_id: int) -> Any:
    with ctx.session() as session:
        token = accounts.issue_token(session, session.merge(users[Role.COORDINATOR]), "t")
    answer = client.get(
        f"/api/v1/studies/{study_id}/monitor", headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.json is not None
    [row] = answer.json["attempts"]
    return row


def _idle_alerts(ctx: Context) -> list[str]:
    with ctx.session() as session:
        return list(session.scalars(select(Alert.message).where(Alert.rule == AlertRule.IDLE)))


def test_terminal_work_the_hub_saw_is_activity(
    ctx: Context, tmp_path: Path, hub: FakeHub, client: FlaskClient, users: Users
) -> None:
    """Resumed 2 h ago, typing in a terminal until 10 min ago (only the hub knows): not idle
    under the 60 min default, and the board's last activity is the hub's."""
    now = utcnow()
    attempt_id, user_id, study_id = _terminal_worker(ctx, tmp_path, now - timedelta(hours=2))
    typed = (now - timedelta(minutes=10)).replace(microsecond=0)
    hub.servers[(f"u{user_id}", f"a{attempt_id}")] = typed
    alerts.evaluate_job(ctx)
    assert _idle_alerts(ctx) == []
    row = _board_row(client, ctx, users, study_id)
    assert datetime.fromisoformat(row["last_activity_at"]) == typed
    assert row["idle_working_s"] < 20 * 60
    assert row["hub_activity_unknown"] is None


def test_a_silent_hub_is_said_not_guessed(
    ctx: Context,
    tmp_path: Path,
    hub: FakeHub,
    client: FlaskClient,
    users: Users,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hub answers 503: the idle alert rests on Baseline's records and says so, and so do
    the board's line and `study watch`; once the hub answers again the alert clears."""
    now = utcnow()
    attempt_id, user_id, study_id = _terminal_worker(ctx, tmp_path, now - timedelta(hours=2))
    hub.servers[(f"u{user_id}", f"a{attempt_id}")] = now - timedelta(minutes=5)
    hub.failing = True
    alerts.evaluate_job(ctx)
    [message] = _idle_alerts(ctx)
    assert "Baseline's records only: JupyterHub did not answer" in message
    row = _board_row(client, ctx, users, study_id)
    assert "JupyterHub did not answer" in row["hub_activity_unknown"]
    monkeypatch.setenv("BASELINE_HOME", str(ctx.settings.home))
    monkeypatch.setenv("BASELINE_DATABASE_URL", ctx.settings.database_url)
    main(["study", "watch", str(study_id), "--once"])
    assert "* idle from Baseline's records only: JupyterHub did not answer" in (
        capsys.readouterr().out
    )
    hub.failing = False
    alerts.evaluate_job(ctx)
    with ctx.session() as session:
        assert session.scalars(select(Alert.cleared_at)).one() is not None


def test_boards_never_call_the_hub_and_one_listing_serves_every_server(
    ctx: Context,
    tmp_path: Path,
    hub: FakeHub,
    client: FlaskClient,
    users: Users,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three terminal workers over two pages of the hub's listing: each evaluation round asks
    the hub one listing (two pages), and a hundred board requests ask it nothing."""
    monkeypatch.setattr("infra.hub.hub_api.USERS_PAGE", 2)
    now = utcnow()
    found = [_terminal_worker(ctx, tmp_path, now - timedelta(hours=2)) for _ in range(3)]
    for attempt_id, user_id, _ in found:
        hub.servers[(f"u{user_id}", f"a{attempt_id}")] = now - timedelta(minutes=1)
    alerts.evaluate_job(ctx)
    assert len(hub.requests) == 2 and _idle_alerts(ctx) == []
    for _ in range(100):
        _board_row(client, ctx, users, found[0][2])
    assert len(hub.requests) == 2


def test_no_hub_user_no_hub_call(ctx: Context, tmp_path: Path, hub: FakeHub) -> None:
    """A study whose people never opened the hub: the job asks the hub nothing."""
    attempt_id = make_attempt(ctx, human=True)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path))
    alerts.evaluate_job(ctx)
    assert hub.requests == []


def test_a_stale_reading_is_unknown(ctx: Context, tmp_path: Path, hub: FakeHub) -> None:
    """The evaluation job stopped: the last reading ages into "unknown", naming when it was."""
    from baseline.monitor import board, hub_activity

    now = utcnow()
    attempt_id, user_id, _ = _terminal_worker(ctx, tmp_path, now - timedelta(hours=2))
    hub.servers[(f"u{user_id}", f"a{attempt_id}")] = now - timedelta(minutes=1)
    reading = hub_activity.refresh(ctx, now=now - timedelta(minutes=5))
    assert reading is not None and hub_activity.load(ctx.settings) == reading
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        [row] = board.study_board(session, attempt.study, now, reading).attempts
    assert row.hub_activity_at is None
    assert row.hub_activity_unknown is not None and "JupyterHub last read at" in (
        row.hub_activity_unknown
    )
