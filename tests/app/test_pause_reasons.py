"""A person's pause reasons (issue 40 item 5): coordinators are offered, and may post, only the
reasons a person pauses for; the platform's own (rate_limit, scoring, idle, outage...) are refused,
so a coordinator's pause never makes the Move panel say the host is not answering."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy.orm import Session

from baseline.attempts import attempts, clock, snapshots
from baseline.context import Context
from baseline.models import Attempt, PauseReason, Role, Task, TaskKind
from baseline.people import accounts
from baseline.studies import studies
from tests.conftest import Users, login

pytestmark = pytest.mark.sqlite_only("the pause form and its refusals, not the storage")

SYSTEM = [r for r in PauseReason if r not in (PauseReason.ADMIN, PauseReason.PARTICIPANT)]


@pytest.fixture
def running(ctx: Context, users: Users, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """A human's attempt whose clock runs (its submission a local folder)."""
    (tmp_path / "submission").mkdir()

    def finder(_session: Session, _attempt: Attempt) -> snapshots.SubmissionSource:
        return snapshots.DirectorySource(str(tmp_path / "submission"))

    monkeypatch.setattr(snapshots, "_FINDERS", [finder])
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Pauses"), None)
        task = Task(slug="pause-task", title="Pause", kind=TaskKind.PAPER, content_hash="0" * 64)
        session.add(task)
        session.flush()
        studies.add_task(session, study, task, None)
        me = session.merge(users[Role.PARTICIPANT])
        participant = studies.enroll_human(session, study.id, me, None)
        attempt_id = studies.create_attempt(session, participant, task, None).id
    attempts.start(ctx, attempt_id, None, snapshots.resolve_source)
    attempts.first_login(ctx, attempt_id, users[Role.PARTICIPANT].id)
    return attempt_id


def _page(client: FlaskClient, attempt_id: int) -> tuple[str, str]:
    page = client.get(f"/attempts/{attempt_id}").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token
    return page, token.group(1)


def test_coordinators_are_offered_and_may_post_only_a_persons_reasons(
    ctx: Context, client: FlaskClient, users: Users, running: int
) -> None:
    login(client, users[Role.COORDINATOR].email)
    page, token = _page(client, running)
    select = re.search(r'<select id="reason" name="reason">(.*?)</select>', page, re.S)
    assert select
    offered = re.findall(r'<option value="([^"]+)"', select.group(1))
    assert offered == ["admin", "participant"]
    for reason in SYSTEM:
        refused = client.post(
            f"/attempts/{running}/pause", data={"csrf_token": token, "reason": reason.value}
        )
        assert refused.status_code == 422, reason
        assert "set by the platform" in refused.get_data(as_text=True)
    with ctx.session() as session:
        attempt = session.get(Attempt, running)
        assert attempt is not None and clock.open_pause(attempt) is None
    paused = client.post(
        f"/attempts/{running}/pause", data={"csrf_token": token, "reason": "admin"}
    )
    assert paused.status_code == 302
    page, _ = _page(client, running)
    assert "reason: admin" in page and "not answering" not in page


def test_the_api_refuses_the_platforms_reasons(
    ctx: Context, client: FlaskClient, users: Users, running: int
) -> None:
    with ctx.session() as session:
        token = accounts.issue_token(session, session.merge(users[Role.COORDINATOR]), "t")
    headers = {"Authorization": f"Bearer {token}"}
    for reason in ("outage", "rate_limit", "scoring", "idle"):
        answer = client.post(
            f"/api/v1/attempts/{running}/pause", json={"reason": reason}, headers=headers
        )
        assert answer.status_code == 422, reason
    ok = client.post(f"/api/v1/attempts/{running}/pause", json={"reason": "admin"}, headers=headers)
    assert ok.status_code == 200, ok.get_data(as_text=True)
