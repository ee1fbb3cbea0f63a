"""The attempts pages: who sees which attempt, the timeline, and the audited clock actions."""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.attempts import attempts, snapshots
from baseline.context import Context
from baseline.models import (
    Attempt,
    AttemptStatus,
    AuditEvent,
    PauseReason,
    Role,
    Task,
    TaskKind,
)
from baseline.people import accounts
from baseline.studies import studies
from tests.app.html_form import form_fields
from tests.conftest import PASSWORD, Users, login


@dataclass
class World:
    own: int
    foreign: int
    submission: Path


@pytest.fixture
def world(
    ctx: Context, users: Users, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "README.md").write_text("start")

    def finder(_session: Session, _attempt: Attempt) -> snapshots.SubmissionSource:
        return snapshots.DirectorySource(str(submission))

    monkeypatch.setattr(snapshots, "_FINDERS", [finder])
    with ctx.session() as session:
        me = session.merge(users[Role.PARTICIPANT])
        other = accounts.create_user(
            session, "someone@test.example", "Someone Else", PASSWORD, Role.PARTICIPANT
        )
        study = studies.create_study(session, studies.StudySpec(name="Pages study"), None)
        task = Task(slug="pages-task", title="Pages", kind=TaskKind.PAPER, content_hash="0" * 64)
        session.add(task)
        session.flush()
        studies.add_task(session, study, task, None)
        session.flush()
        session.refresh(study)
        own = studies.create_attempt(
            session, studies.enroll_human(session, study.id, me, None), task, None
        ).id
        foreign = studies.create_attempt(
            session, studies.enroll_human(session, study.id, other, None), task, None
        ).id
    for attempt_id in (own, foreign):
        attempts.start(ctx, attempt_id, None, snapshots.resolve_source)
    yield World(own, foreign, submission)


def _token(page: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


def _post(client: FlaskClient, attempt_id: int, action: str, **data: str) -> int:
    token = _token(client.get(f"/attempts/{attempt_id}").get_data(as_text=True))
    response = client.post(f"/attempts/{attempt_id}/{action}", data={"csrf_token": token, **data})
    return response.status_code


def test_participant_sees_only_their_attempts(
    client: FlaskClient, users: Users, world: World
) -> None:
    login(client, users[Role.PARTICIPANT].email)
    listing = client.get("/attempts/").get_data(as_text=True)
    assert f'/attempts/{world.own}"' in listing
    assert f'/attempts/{world.foreign}"' not in listing
    # waiting for the first login: not a pause anyone took (it read "ready · not_started")
    assert '<span class="badge ">ready · not started</span>' in listing, listing
    assert "Someone Else" not in listing
    assert client.get(f"/attempts/{world.own}").status_code == 200
    assert client.get(f"/attempts/{world.foreign}").status_code == 404
    token = _token(client.get(f"/attempts/{world.own}").get_data(as_text=True))
    refused = client.post(f"/attempts/{world.foreign}/pause", data={"csrf_token": token})
    assert refused.status_code == 404
    assert client.get(f"/attempts/{world.foreign}/export?snapshot=1").status_code == 404


def test_graders_and_analysts_are_blind(client: FlaskClient, users: Users, world: World) -> None:
    for role, area in ((Role.GRADER, "/grading/"), (Role.ANALYST, "/analysis/")):
        login(client, users[role].email)
        listing = client.get("/attempts/")
        assert listing.status_code == 302 and listing.headers["Location"].endswith(area)
        assert client.get(f"/attempts/{world.own}").status_code == 403


def test_participant_starts_pauses_and_resumes_own_clock(
    ctx: Context, client: FlaskClient, users: Users, world: World
) -> None:
    login(client, users[Role.PARTICIPANT].email)
    page = client.get(f"/attempts/{world.own}").get_data(as_text=True)
    assert "Start working" in page
    assert _post(client, world.own, "begin") == 302
    assert _post(client, world.own, "pause", note="coffee", reason="admin") == 302
    with ctx.session() as session:
        attempt = session.get(Attempt, world.own)
        assert attempt is not None and attempt.status is AttemptStatus.PAUSED
        # a participant's pause is always a participant pause, whatever the form says
        assert attempt.pauses[-1].reason is PauseReason.PARTICIPANT
        assert attempt.pauses[-1].note == "coffee"
    assert _post(client, world.own, "resume") == 302
    # staff-only actions stay staff-only
    assert _post(client, world.own, "extend", hours="1", reason="x") == 403
    assert _post(client, world.own, "snapshot") == 403
    with ctx.session() as session:
        actions = [
            (e.action, e.actor_id)
            for e in session.query(AuditEvent).filter(AuditEvent.target_id == str(world.own))
        ]
    me = users[Role.PARTICIPANT].id
    assert ("attempt.first_login", me) in actions
    assert ("attempt.pause", me) in actions and ("attempt.resume", me) in actions


def test_participant_cannot_resume_an_admin_pause(
    client: FlaskClient, users: Users, world: World, ctx: Context
) -> None:
    attempts.first_login(ctx, world.own, users[Role.PARTICIPANT].id)
    attempts.pause(ctx, world.own, PauseReason.OUTAGE, None, "host down")
    login(client, users[Role.PARTICIPANT].email)
    assert _post(client, world.own, "resume") == 403


def test_an_extension_sent_twice_adds_its_hours_once(
    ctx: Context, client: FlaskClient, users: Users, world: World
) -> None:
    attempts.first_login(ctx, world.own, users[Role.PARTICIPANT].id)
    login(client, users[Role.COORDINATOR].email)
    form = form_fields(client.get(f"/attempts/{world.own}").get_data(as_text=True))
    extension = {
        "csrf_token": form["csrf_token"],
        "seen_limit_s": form["seen_limit_s"],
        "hours": "2",
        "reason": "outage compensation",
    }
    url = f"/attempts/{world.own}/extend"
    assert client.post(url, data=extension).status_code == 302
    # the same form again (a double click; a second coordinator who opened it before)
    page_url = f"http://localhost/attempts/{world.own}"
    again = client.post(url, data=extension, headers={"Referer": page_url})
    assert again.status_code == 409
    message = again.get_data(as_text=True)
    # the refusal leads back to the form's page (reloaded), not only to the studies
    assert f'<a href="/attempts/{world.own}" id="came-from">' in message
    elsewhere = client.post(url, data=extension, headers={"Referer": "https://evil.example/x"})
    assert 'id="came-from"' not in elsewhere.get_data(as_text=True)
    assert "the limit is 50 working hours now, not 48 as when you asked" in message, message
    assert "nothing was added" in message
    # the page opened now offers the limit as it is: extending from it adds
    fresh = form_fields(client.get(f"/attempts/{world.own}").get_data(as_text=True))
    assert (
        client.post(url, data={**extension, "seen_limit_s": fresh["seen_limit_s"]}).status_code
        == 302
    )
    with ctx.session() as session:
        attempt = session.get(Attempt, world.own)
        assert attempt is not None and attempt.working_time_limit_s == 52 * 3600
        extended = session.scalars(
            select(AuditEvent).where(AuditEvent.action == "attempt.extend")
        ).all()
        assert [e.details["after_s"] / 3600 for e in extended] == [50, 52]


def test_a_coordinator_withdraws_an_attempt_assigned_by_mistake(
    ctx: Context, client: FlaskClient, users: Users, world: World
) -> None:
    with ctx.session() as session:
        started = session.get(Attempt, world.own)
        assert started is not None
        study_id = started.study_id
        mistake = studies.create_attempt(session, started.participant, started.task, None).id
    login(client, users[Role.PARTICIPANT].email)
    assert _post(client, mistake, "withdraw", reason="mine") == 403
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/attempts/{mistake}").get_data(as_text=True)
    assert 'id="withdraw"' in page and f"Withdraw attempt {mistake}" in page
    assert 'id="withdraw"' not in client.get(f"/attempts/{world.own}").get_data(as_text=True)
    token = _token(page)
    url = f"/attempts/{mistake}/withdraw"
    assert client.post(url, data={"csrf_token": token, "reason": ""}).status_code == 422
    done = client.post(url, data={"csrf_token": token, "reason": "one attempt too many"})
    assert done.status_code == 302 and done.headers["Location"].endswith(f"/studies/{study_id}")
    study_page = client.get(done.headers["Location"]).get_data(as_text=True)
    assert f"Attempt {mistake} withdrawn (it never started)" in study_page
    assert client.get(f"/attempts/{mistake}").status_code == 404
    refused = client.post(
        f"/attempts/{world.own}/withdraw", data={"csrf_token": token, "reason": "oops"}
    )
    assert refused.status_code == 409
    assert "was launched (ready): only an attempt never launched" in refused.get_data(True)
    with ctx.session() as session:
        assert session.get(Attempt, world.own) is not None


def test_coordinator_timeline_actions_and_diff(
    ctx: Context, client: FlaskClient, users: Users, world: World
) -> None:
    attempts.first_login(ctx, world.own, users[Role.PARTICIPANT].id)
    login(client, users[Role.COORDINATOR].email)
    listing = client.get("/attempts/").get_data(as_text=True)
    assert f'/attempts/{world.own}"' in listing and f'/attempts/{world.foreign}"' in listing
    coordinator = users[Role.COORDINATOR].id

    assert _post(client, world.own, "pause", reason="admin", note="host reboot") == 302
    assert _post(client, world.own, "resume") == 302
    assert _post(client, world.own, "extend", hours="2", reason="outage compensation") == 302
    assert _post(client, world.own, "extend", hours="abc", reason="x") == 422
    token = _token(client.get(f"/attempts/{world.own}").get_data(as_text=True))
    none = client.post(
        f"/attempts/{world.own}/extend", data={"csrf_token": token, "hours": "0", "reason": "x"}
    )
    assert none.status_code == 422 and "hours: must be above 0, got 0" in none.get_data(True)
    assert "seconds" not in none.get_data(as_text=True)
    (world.submission / "model.py").write_text("print('trained')")
    (world.submission / "README.md").write_text("changed")
    assert _post(client, world.own, "snapshot") == 302
    with ctx.session() as session:
        attempt = session.get(Attempt, world.own)
        assert attempt is not None
        assert attempt.working_time_limit_s == 50 * 3600
        assert [p.reason for p in attempt.pauses] == [PauseReason.NOT_STARTED, PauseReason.ADMIN]
        start, manual = sorted(attempt.snapshots, key=lambda s: s.id)
        events = {
            e.action: e
            for e in session.query(AuditEvent).filter(AuditEvent.actor_id == coordinator)
        }
    assert set(events) >= {"attempt.pause", "attempt.resume", "attempt.extend", "snapshot.take"}
    assert events["attempt.extend"].details["reason"] == "outage compensation"

    page = client.get(f"/attempts/{world.own}?a={start.id}&b={manual.id}").get_data(as_text=True)
    assert "admin" in page and "host reboot" in page
    assert "manual" in page and "start" in page
    diff = page.split('id="diff"')[1]
    assert "added</span> <code>model.py" in diff
    assert "changed</span> <code>README.md" in diff

    export = client.get(f"/attempts/{world.own}/export?snapshot={manual.id}")
    assert export.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(export.data), mode="r:gz") as archive:
        assert set(archive.getnames()) == {
            "submission",
            "submission/README.md",
            "submission/model.py",
        }
    # a snapshot id of another attempt is not found through this attempt
    assert client.get(f"/attempts/{world.foreign}/export?snapshot={manual.id}").status_code == 404


def test_time_used_csv_for_payouts(
    ctx: Context, client: FlaskClient, users: Users, world: World
) -> None:
    with ctx.session() as session:
        study_id = session.get(Attempt, world.own).study_id  # type: ignore[union-attr]
    login(client, users[Role.PARTICIPANT].email)
    assert client.get(f"/attempts/time.csv?study={study_id}").status_code == 403
    login(client, users[Role.COORDINATOR].email)
    assert f"/attempts/time.csv?study={study_id}" in client.get("/attempts/").get_data(as_text=True)
    response = client.get(f"/attempts/time.csv?study={study_id}")
    assert response.status_code == 200 and response.mimetype == "text/csv"
    lines = response.get_data(as_text=True).splitlines()
    assert lines[0].startswith("attempt_id,participant,pseudonym,kind,status,working_hours")
    assert "paused_not_started_hours" in lines[0]
    assert len(lines) == 3 and "Someone Else" in lines[2]
    assert client.get("/attempts/time.csv").status_code == 422
    assert client.get("/attempts/time.csv?study=999").status_code == 404


def test_actions_need_the_csrf_token(client: FlaskClient, users: Users, world: World) -> None:
    login(client, users[Role.COORDINATOR].email)
    assert client.post(f"/attempts/{world.own}/snapshot").status_code == 400


def test_the_clock_reads_in_plain_words(
    ctx: Context, client: FlaskClient, users: Users, world: World
) -> None:
    with ctx.session() as session:
        study = session.get(Attempt, world.own).study  # type: ignore[union-attr]
        task = session.get(Attempt, world.own).task  # type: ignore[union-attr]
        me = session.merge(users[Role.PARTICIPANT])
        participant = next(p for p in study.participants if p.user_id == me.id)
        pending = studies.create_attempt(session, participant, task, None)
        pending.time_scale = 3600.0
        pending_id, study_id = pending.id, study.id
    login(client, users[Role.PARTICIPANT].email)
    page = client.get(f"/attempts/{pending_id}").get_data(as_text=True)
    assert "not started" in page and ">stopped<" not in page
    assert "one second of real time counts as 1 h of working time" in page
    assert "working s per wall s" not in page
    study_page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    assert "Internet from the workspace" in study_page and ">Egress<" not in study_page
    token = _token(page)
    refused = client.post(f"/attempts/{pending_id}/begin", data={"csrf_token": token})
    assert refused.status_code == 409  # not "Your clock had already started."
    assert "not ready yet" in refused.get_data(as_text=True)


def test_a_pause_reason_reads_as_words(
    ctx: Context, client: FlaskClient, users: Users, world: World
) -> None:
    """The pauses table, the clock's hint, the attempts list and the participant's bar read
    "rate_limit" and "not_started", the stored codes."""
    attempts.first_login(ctx, world.own, users[Role.PARTICIPANT].id)
    attempts.pause(ctx, world.own, PauseReason.RATE_LIMIT, None, "provider said 429")
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/attempts/{world.own}").get_data(as_text=True)
    assert '<span class="badge">rate limit</span>' in page
    assert '<span class="badge">not started</span>' in page  # the wait for the first login
    assert "reason: rate limit" in page and "rate_limit" not in page
    listing = client.get("/attempts/").get_data(as_text=True)
    assert "paused · rate limit" in listing and "rate_limit" not in listing
    login(client, users[Role.PARTICIPANT].email)
    state = client.get(f"/attempts/{world.own}/work/state").get_json()
    assert state["label"] == "paused (rate limit)"


def test_staff_disqualify_an_attempt_from_its_page(
    ctx: Context, client: FlaskClient, users: Users, world: World
) -> None:
    """A coordinator who reviewed a blacklist hit had to run `baseline attempt disqualify` on the
    portal's machine: the page had no way to do it."""
    login(client, users[Role.PARTICIPANT].email)
    assert "Disqualify" not in client.get(f"/attempts/{world.own}").get_data(as_text=True)
    assert _post(client, world.own, "disqualify", reason="mine") == 403
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/attempts/{world.own}").get_data(as_text=True)
    assert 'id="disqualify"' in page
    assert _post(client, world.own, "disqualify", reason=" ") == 422  # a reason is needed
    assert _post(client, world.own, "disqualify", reason="used a blacklisted site") == 302
    with ctx.session() as session:
        attempt = session.get(Attempt, world.own)
        assert attempt is not None and attempt.status is AttemptStatus.DISQUALIFIED
        assert attempt.end_reason == "used a blacklisted site"
        audited = session.scalars(
            select(AuditEvent).where(AuditEvent.action == "attempt.disqualify")
        ).one()
        assert audited.actor_id == users[Role.COORDINATOR].id
    page = client.get(f"/attempts/{world.own}").get_data(as_text=True)
    assert 'id="disqualify"' not in page and "used a blacklisted site" in page


def test_checkpoints_of_an_attempt_waiting_for_its_first_login_are_due_after_it(
    ctx: Context, client: FlaskClient, users: Users, world: World
) -> None:
    """They read "after the pause" while no pause had been taken: the clock waits for the
    participant's first login."""
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/attempts/{world.own}").get_data(as_text=True)
    assert "after the first login" in page and "after the pause" not in page
    attempts.first_login(ctx, world.own, users[Role.PARTICIPANT].id)
    attempts.pause(ctx, world.own, PauseReason.ADMIN, None, "")
    page = client.get(f"/attempts/{world.own}").get_data(as_text=True)
    assert "after the pause" in page and "after the first login" not in page
