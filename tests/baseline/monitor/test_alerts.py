"""Alert rules fire once, clear and are acknowledged; firings and clearings are delivered by
e-mail (a local SMTP server) and to a signed webhook that fails first, each delivery recorded.

The idle participant and the late checkpoint come from time-scaled clocks that really run (an
hour of working time per wall second), polled, never slept through.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from datetime import timedelta
from email import message_from_bytes
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from baseline.attempts import attempts, schedule
from baseline.context import Context
from baseline.errors import Conflict, NotFound
from baseline.models import (
    Alert,
    AlertDelivery,
    AlertRule,
    Attempt,
    Grading,
    GradingKind,
    JobStatus,
    ModelCall,
    PauseReason,
    Role,
    Snapshot,
    Study,
    User,
    utcnow,
)
from baseline.monitor import alerts, delivery, settings
from tests.baseline.attempt_world import directory_resolver, make_attempt, started_human_attempt
from tests.baseline.monitor.conftest import Hook, Mailbox
from tests.conftest import Users
from tests.ports import free_port

OFF = settings.Thresholds(
    workspace_dead=False,
    idle_minutes=None,
    snapshot_late_minutes=None,
    failure_rate=None,
    queue_minutes=None,
    host_down=False,
    spend_share=None,
)


def _configure(ctx: Context, study_id: int, **changes: Any) -> None:
    thresholds = OFF.model_copy(update=changes.pop("thresholds", {}))
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        settings.save(
            session, study, settings.MonitorConfig(thresholds=thresholds, **changes), None
        )


def _study_of(ctx: Context, attempt_id: int) -> int:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        return attempt.study_id


def _alerts(ctx: Context, study_id: int) -> list[Alert]:
    with ctx.session() as session:
        return list(session.scalars(select(Alert).where(Alert.study_id == study_id)))


def until_fired(ctx: Context, study_id: int, timeout_s: float = 10.0) -> alerts.Evaluation:
    """Evaluate (delivering) until something fires."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = alerts.evaluate_and_deliver(ctx, study_id)
        if result.fired:
            return result
        time.sleep(0.05)
    raise AssertionError("no alert fired")


@pytest.mark.sqlite_only(
    "delivery and time-scaled clocks; the board's queries run on PostgreSQL in test_board"
)
def test_an_idle_participant_on_a_running_clock_fires_once_and_clears(
    ctx: Context, tmp_path: Path
) -> None:
    world = started_human_attempt(ctx, tmp_path, docker_url="unix:///nonexistent", time_scale=3600)
    study_id = _study_of(ctx, world.attempt_id)
    _configure(ctx, study_id, thresholds={"idle_minutes": 30.0})
    attempts.first_login(ctx, world.attempt_id, world.user_id)  # the clock runs from here
    logged_in = utcnow()
    # not idle yet, read at the login itself: at an hour per second, a loaded machine's next
    # evaluation can already be 30 working minutes later
    assert alerts.evaluate_and_deliver(ctx, study_id, now=logged_in).fired == []
    fired = until_fired(ctx, study_id)
    for _ in range(3):  # still idle: no second alert
        assert alerts.evaluate_and_deliver(ctx, study_id).fired == []
    [alert] = _alerts(ctx, study_id)
    assert fired.fired == [alert.id] and alert.rule is AlertRule.IDLE
    assert alert.subject == f"attempt:{world.attempt_id}" and alert.cleared_at is None
    assert "no activity" in alert.message
    # the participant pauses (their own action): the clock no longer runs, the alert clears
    attempts.pause(ctx, world.attempt_id, PauseReason.PARTICIPANT, None, "break")
    assert alerts.evaluate_and_deliver(ctx, study_id).cleared == [alert.id]
    [alert] = _alerts(ctx, study_id)
    assert alert.cleared_at is not None and alert.cleared_at >= alert.fired_at


@pytest.mark.sqlite_only(
    "delivery and time-scaled clocks; the board's queries run on PostgreSQL in test_board"
)
def test_a_checkpoint_snapshot_not_taken_fires_and_clears_when_taken(
    ctx: Context, tmp_path: Path
) -> None:
    # no scheduler runs here: the 0.1 h checkpoint falls due and nothing takes it
    attempt_id = make_attempt(ctx, checkpoints=(0.1,), time_scale=3600)
    study_id = _study_of(ctx, attempt_id)
    _configure(ctx, study_id, thresholds={"snapshot_late_minutes": 20.0})
    resolver = directory_resolver(tmp_path)
    attempts.start(ctx, attempt_id, None, resolver)
    until_fired(ctx, study_id)
    [alert] = _alerts(ctx, study_id)
    assert alert.rule is AlertRule.SNAPSHOT_LATE and "0.1 h missing" in alert.message
    schedule.run_due(ctx, attempt_id, resolver)  # the late checkpoint is taken now
    with ctx.session() as session:
        kinds = [
            s.kind.value
            for s in session.scalars(select(Snapshot).where(Snapshot.attempt_id == attempt_id))
        ]
    assert "checkpoint" in kinds
    assert alerts.evaluate_and_deliver(ctx, study_id).cleared == [alert.id]


def test_queue_age_failure_rate_and_spend_fire_on_their_thresholds(
    ctx: Context, tmp_path: Path
) -> None:
    attempt_id = make_attempt(ctx)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path))
    study_id = _study_of(ctx, attempt_id)
    _configure(
        ctx,
        study_id,
        budget_usd=10.0,
        thresholds={
            "queue_minutes": 30.0,
            "failure_rate": 0.5,
            "failure_min_count": 3,
            "spend_share": 0.8,
        },
    )
    with ctx.session() as session:
        snap = session.scalars(select(Snapshot).where(Snapshot.attempt_id == attempt_id)).one()
        old = utcnow() - timedelta(minutes=45)
        session.add(Grading(snapshot_id=snap.id, kind=GradingKind.JUDGE, created_at=old))
        for error in ("crashed", "crashed", None):
            session.add(
                Grading(
                    snapshot_id=snap.id, kind=GradingKind.SCRIPT, status=JobStatus.SUCCEEDED,
                    error=error, finished_at=utcnow(),
                )
            )  # fmt: skip
        session.add(
            ModelCall(
                study_id=study_id, attempt_id=attempt_id, purpose="agent", model="m", cost_usd=7.9
            )
        )
    first = alerts.evaluate_and_deliver(ctx, study_id).fired
    # a 45-minute-old queue, 2 of 3 gradings failing; not the spend: 79% of the budget
    assert {a.rule for a in _alerts(ctx, study_id) if a.id in first} == {
        AlertRule.QUEUE_AGE,
        AlertRule.FAILURE_RATE,
    }
    with ctx.session() as session:
        session.add(
            ModelCall(
                study_id=study_id, attempt_id=attempt_id, purpose="agent", model="m", cost_usd=0.2
            )
        )
        queued = session.scalars(select(Grading).where(Grading.status == JobStatus.QUEUED)).one()
    second = alerts.evaluate_and_deliver(ctx, study_id).fired
    assert [a.rule for a in _alerts(ctx, study_id) if a.id in second] == [AlertRule.SPEND]
    with ctx.session() as session:
        row = session.get(Grading, queued.id)
        assert row is not None
        row.status = JobStatus.RUNNING
    cleared = alerts.evaluate_and_deliver(ctx, study_id).cleared
    assert [a.rule for a in _alerts(ctx, study_id) if a.id in cleared] == [AlertRule.QUEUE_AGE]


def test_an_alert_is_acknowledged_once_by_a_named_user(
    ctx: Context, tmp_path: Path, users: Users
) -> None:
    attempt_id = make_attempt(ctx)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path))
    study_id = _study_of(ctx, attempt_id)
    _configure(ctx, study_id, budget_usd=1.0, thresholds={"spend_share": 0.5})
    with ctx.session() as session:
        session.add(ModelCall(study_id=study_id, purpose="judge_grade", model="j", cost_usd=0.6))
    [alert_id] = alerts.evaluate_and_deliver(ctx, study_id).fired
    coordinator = users[Role.COORDINATOR]
    with ctx.session() as session:
        user = session.get(User, coordinator.id)
        assert user is not None
        alerts.acknowledge(session, study_id, alert_id, user)
    with ctx.session() as session:
        user = session.get(User, coordinator.id)
        assert user is not None
        with pytest.raises(Conflict):
            alerts.acknowledge(session, study_id, alert_id, user)
        with pytest.raises(NotFound):
            alerts.acknowledge(session, study_id + 1, alert_id, user)
    [alert] = _alerts(ctx, study_id)
    assert alert.acknowledged_by_id == coordinator.id and alert.acknowledged_at is not None
    assert alert.cleared_at is None  # acknowledging does not clear: the spend is still past


@pytest.mark.sqlite_only(
    "delivery and time-scaled clocks; the board's queries run on PostgreSQL in test_board"
)
def test_firing_and_clearing_are_mailed_and_posted_signed_with_retries(
    ctx: Context,
    tmp_path: Path,
    smtp: Mailbox,
    hook: Hook,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sleeps: list[float] = []
    real_post: Callable[..., delivery.Outcome] = delivery.post_webhook

    def quick_post(*args: Any, **kwargs: Any) -> delivery.Outcome:
        def sleep(s: float) -> None:
            sleeps.append(s)  # the back-off asked for; slept for a fiftieth of it
            time.sleep(s / 50)

        return real_post(*args, **{**kwargs, "sleep": sleep})

    monkeypatch.setattr(delivery, "post_webhook", quick_post)
    attempt_id = make_attempt(ctx)
    attempts.start(ctx, attempt_id, None, directory_resolver(tmp_path))
    study_id = _study_of(ctx, attempt_id)
    _configure(
        ctx,
        study_id,
        budget_usd=1.0,
        thresholds={"spend_share": 0.5},
        email_to=["coord@test.example", "pi@test.example"],
        webhook_url=hook.url,
    )
    with ctx.session() as session:
        secret = settings.webhook_secret(session, study_id)
        assert secret
        session.add(ModelCall(study_id=study_id, purpose="judge_grade", model="j", cost_usd=0.9))
    [alert_id] = alerts.evaluate_and_deliver(ctx, study_id).fired
    assert sleeps == [0.5, 1.0]  # two 503s, doubling back-off, then 200
    assert len(smtp.messages) == 1
    mail = message_from_bytes(smtp.messages[0])
    assert mail["To"] == "coord@test.example, pi@test.example"
    assert mail["Subject"].endswith("fired: spend spend")
    assert "spent $0.90 of the $1.00 budget" in mail.get_payload()
    assert len(hook.requests) == 3
    headers, body = hook.requests[-1]
    expected = hmac.new(
        secret.encode(), headers["X-Baseline-Timestamp"].encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    assert headers["X-Baseline-Signature"] == f"sha256={expected}"
    assert json.loads(body)["event"] == "fired" and json.loads(body)["alert_id"] == alert_id
    # the budget is raised: the alert clears, and the clearing is delivered too
    _configure(
        ctx, study_id, budget_usd=5.0, thresholds={"spend_share": 0.5},
        email_to=["coord@test.example"], webhook_url=hook.url,
    )  # fmt: skip
    assert alerts.evaluate_and_deliver(ctx, study_id).cleared == [alert_id]
    assert json.loads(hook.requests[-1][1])["event"] == "cleared"
    assert "cleared: spend" in message_from_bytes(smtp.messages[-1])["Subject"]
    with ctx.session() as session:
        rows = session.scalars(select(AlertDelivery).order_by(AlertDelivery.id)).all()
        got = [(r.channel, r.event, r.tries, r.ok) for r in rows]
    assert got == [
        ("email", "fired", 1, True),
        ("webhook", "fired", 3, True),
        ("email", "cleared", 1, True),
        ("webhook", "cleared", 1, True),
    ]


def test_a_webhook_that_never_answers_is_recorded_as_failed() -> None:
    port = free_port()  # nothing listens
    outcome = delivery.post_webhook(
        f"http://127.0.0.1:{port}/", "s", {"x": 1}, tries=3, sleep=lambda _s: None
    )
    assert outcome.tries == 3 and not outcome.ok and outcome.error
    assert "Connection" in outcome.error or "refused" in outcome.error


def test_bad_settings_are_refused_with_their_reasons() -> None:
    from baseline.errors import InvalidInput

    with pytest.raises(InvalidInput, match="not an e-mail address: nobody"):
        settings.parse({"email_to": ["nobody"]})
    with pytest.raises(InvalidInput, match="webhook_url"):
        settings.parse({"webhook_url": "ftp://x"})
    with pytest.raises(InvalidInput, match=r"thresholds\.failure_rate"):
        settings.parse({"thresholds": {"failure_rate": 2}})
