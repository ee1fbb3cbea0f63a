"""Editing a study's settings (issue 40 item 5): labels and the payout rate any time; what makes
attempts comparable only until the first attempt starts; every change audited before/after."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from baseline.attempts import attempts, snapshots
from baseline.context import Context
from baseline.errors import Conflict, InvalidInput
from baseline.models import (
    Attempt,
    AttemptStatus,
    AuditEvent,
    Role,
    Study,
    StudyStatus,
    Task,
    utcnow,
)
from baseline.people import accounts
from baseline.studies import studies
from baseline.tasks import tasks

pytestmark = pytest.mark.sqlite_only("the edit rules, not the storage")


def _study_with_attempt(ctx: Context) -> tuple[int, int]:
    """A study with one task and one agent's attempt, created but not started."""
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Editable"), None)
        task = tasks.import_demo_tasks(session, ctx.settings)[0]
        studies.add_task(session, study, task, None)
        agent = studies.add_agent(session, study, "A", "basic", "m", "", {}, None)
        attempt = studies.create_attempt(session, agent, task, None)
        return study.id, attempt.id


def _edit(ctx: Context, study_id: int, **changes: Any) -> dict[str, dict[str, Any]]:
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        return studies.edit_study(session, study, changes, actor_id=None)


def _start(ctx: Context, attempt_id: int) -> None:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.started_at = utcnow()


def test_before_any_start_everything_changes_pending_attempts_follow_and_it_is_audited(
    ctx: Context,
) -> None:
    study_id, attempt_id = _study_with_attempt(ctx)
    changed = _edit(
        ctx, study_id, checkpoint_hours=[1.0, 4.0], working_time_limit_hours=6.0,
        wall_clock_limit_hours=12.0, time_scale=60.0, description="new words",
    )  # fmt: skip
    assert changed["checkpoint_hours"] == {"before": [2.0, 8.0, 32.0, 48.0], "after": [1.0, 4.0]}
    assert changed["working_time_limit_hours"] == {"before": 48.0, "after": 6.0}
    with ctx.session() as session:
        study = session.get(Study, study_id)
        attempt = session.get(Attempt, attempt_id)
        assert study is not None and attempt is not None
        assert study.checkpoint_hours == [1.0, 4.0] and study.description == "new words"
        # The attempt created before the edit is measured under the new limits.
        assert attempt.working_time_limit_s == 6 * 3600.0
        assert attempt.wall_clock_limit_s == 12 * 3600.0 and attempt.time_scale == 60.0
        event = session.scalars(select(AuditEvent).where(AuditEvent.action == "study.edit")).one()
        assert event.target_id == str(study_id)
        assert event.details["changes"]["time_scale"] == {"before": 1.0, "after": 60.0}


@pytest.mark.parametrize(
    "changes",
    [
        {"checkpoint_hours": [1.0, 2.0]},
        {"working_time_limit_hours": 10.0},
        {"wall_clock_limit_hours": None, "time_scale": 2.0},
        {"hardware_profile": "a10"},
        {"egress_policy": "none"},
        {"snapshot_policy": "paperbench"},
        {"idle_pause_minutes": 30.0},
        {"snapshot_interval_minutes": 15.0},
        {"reproduction_timeout_minutes": 60.0},
    ],
)
def test_comparability_settings_are_refused_once_an_attempt_started(
    ctx: Context, changes: dict[str, Any]
) -> None:
    study_id, attempt_id = _study_with_attempt(ctx)
    if changes.get("time_scale"):  # so that the unset wall-clock cap is no change on its own
        _edit(ctx, study_id, wall_clock_limit_hours=5.0)
    _start(ctx, attempt_id)
    with ctx.session() as session:
        before = studies.spec_of(session.get(Study, study_id))  # type: ignore[arg-type]
    with pytest.raises(Conflict) as refused:
        _edit(ctx, study_id, **changes)
    assert f"fixed since attempt {attempt_id} started" in refused.value.message
    assert sorted(changes)[0] in refused.value.message
    with ctx.session() as session:
        assert studies.spec_of(session.get(Study, study_id)) == before  # type: ignore[arg-type]


def test_labels_and_rate_change_after_the_start_and_an_unchanged_value_is_no_change(
    ctx: Context,
) -> None:
    study_id, attempt_id = _study_with_attempt(ctx)
    _start(ctx, attempt_id)
    changed = _edit(
        ctx, study_id, name=" Renamed ", description="d", human_hourly_rate_usd=25.0,
        checkpoint_hours=[2.0, 8.0, 32.0, 48.0],  # as it is: not a change, so not refused
    )  # fmt: skip
    assert set(changed) == {"name", "description", "human_hourly_rate_usd"}
    assert changed["name"] == {"before": "Editable", "after": "Renamed"}
    assert _edit(ctx, study_id, name="Renamed") == {}
    with ctx.session() as session:
        events = session.scalars(select(AuditEvent).where(AuditEvent.action == "study.edit"))
        assert len(events.all()) == 1


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"checkpoint_hours": [8.0, 2.0]}, InvalidInput, "strictly increasing"),
        ({"working_time_limit_hours": 0.0}, InvalidInput, "working_time_limit_hours"),
        ({"human_hourly_rate_usd": -1.0}, InvalidInput, "human_hourly_rate_usd"),
        ({"egress_policy": "sometimes"}, InvalidInput, "egress_policy"),
        ({"name": "  "}, InvalidInput, "name"),
        ({"consent_text": "x"}, InvalidInput, "not an editable study setting: consent_text"),
        ({"name": "Other"}, Conflict, "exists already"),
    ],
)
def test_bad_edits_are_refused_saying_why_and_store_nothing(
    ctx: Context, changes: dict[str, Any], error: type[Exception], message: str
) -> None:
    study_id, _ = _study_with_attempt(ctx)
    with ctx.session() as session:
        studies.create_study(session, studies.StudySpec(name="Other"), None)
    with pytest.raises(error, match=message):
        _edit(ctx, study_id, **changes)
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None and study.name == "Editable"
        assert study.checkpoint_hours == [2.0, 8.0, 32.0, 48.0]
        assert (
            session.scalars(select(AuditEvent).where(AuditEvent.action == "study.edit")).all() == []
        )


def test_the_status_means_something(ctx: Context) -> None:
    """A draft becomes active at its first start and cannot go back to draft; a closed study
    takes no new attempts, participants or tasks until it is active again."""
    study_id, attempt_id = _study_with_attempt(ctx)
    attempts.start(ctx, attempt_id, None, snapshots.resolve_source)
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None and study.status is StudyStatus.ACTIVE
        with pytest.raises(Conflict, match=f"attempt {attempt_id} has started already"):
            studies.set_status(session, study, StudyStatus.DRAFT, None)
        studies.set_status(session, study, StudyStatus.CLOSED, None)
        agent = study.participants[0]
        task = study.tasks[0].task
        with pytest.raises(Conflict, match="is closed: it takes no new attempts"):
            studies.create_attempt(session, agent, task, None)
        with pytest.raises(Conflict, match="is closed"):
            studies.add_agent(session, study, "B", "basic", "m", "", {}, None)
        # a participant's invitation would fail only once accepted: refused now; a grader's not
        hour = timedelta(hours=1)
        with pytest.raises(Conflict, match="is closed"):
            accounts.create_invitation(session, Role.PARTICIPANT, hour, None, study_id)
        accounts.create_invitation(session, Role.GRADER, hour, None, study_id)
        other_task = session.scalars(select(Task).where(Task.id != task.id)).first()
        assert other_task is not None
        with pytest.raises(Conflict, match="is closed: it takes no new tasks"):
            studies.add_task(session, study, other_task, None)
        studies.set_status(session, study, StudyStatus.ACTIVE, None)
        assert studies.create_attempt(session, agent, task, None).id
        studies.add_task(session, study, other_task, None)
        actions = session.scalars(
            select(AuditEvent.details).where(AuditEvent.action == "study.status")
        ).all()
        assert actions[0]["why"] == "its first attempt started"


def test_a_study_is_archived_only_once_every_attempt_has_ended(ctx: Context) -> None:
    """Archiving a study with an attempt running left its clock and workspace running while the
    worker, which passes archived studies over, scored none of its checkpoints."""
    study_id, attempt_id = _study_with_attempt(ctx)
    with ctx.session() as session:  # a second attempt, which ends at its limit
        first = session.get(Attempt, attempt_id)
        assert first is not None
        ended = studies.create_attempt(session, first.participant, first.task, None)
        ended.status, ended_id = AttemptStatus.ENDED, ended.id
    attempts.start(ctx, attempt_id, None, snapshots.resolve_source)
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        with pytest.raises(Conflict, match=f"status archived: attempt {attempt_id} \\(running\\)"):
            studies.set_status(session, study, StudyStatus.ARCHIVED, None)
        studies.set_status(session, study, StudyStatus.CLOSED, None)  # it may finish
    attempts.disqualify(ctx, attempt_id, None, "used a second account")
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None and study.status is StudyStatus.CLOSED
        studies.set_status(session, study, StudyStatus.ARCHIVED, None)
        assert study.status is StudyStatus.ARCHIVED
    # the record stays as it is: a later disqualification is refused, saying how to make one
    with pytest.raises(Conflict, match="set it closed to disqualify its attempts"):
        attempts.disqualify(ctx, ended_id, None, "found in review")
