"""The working-time clock: pure interval arithmetic, and the pause/extension helpers."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from baseline.attempts import attempts, clock
from baseline.context import Context
from baseline.errors import Conflict, InvalidInput
from baseline.models import Attempt, AttemptStatus, AuditEvent, PauseReason
from tests.baseline.attempt_world import directory_resolver, make_attempt

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def iv(start: float, end: float | None) -> clock.Interval:
    return clock.Interval(at(start), None if end is None else at(end))


def test_working_time_is_wall_minus_merged_pauses() -> None:
    pauses = [iv(10, 20), iv(15, 30), iv(50, 60)]  # overlapping pauses count once
    assert clock.working_s(T0, pauses, at(100)) == 100 - 20 - 10
    assert clock.working_s(T0, pauses, at(25)) == 10
    assert clock.working_s(T0, [iv(40, None)], at(100)) == 40  # open pause runs to now
    assert clock.working_s(T0, [], at(-5)) == 0
    assert clock.working_s(None, [], at(100)) == 0


def test_time_scale_multiplies_running_wall_time() -> None:
    # 3600 working seconds per wall second: 2 wall seconds of work = 2 working hours.
    assert clock.working_s(T0, [iv(1, 3)], at(4), time_scale=3600) == 2 * 3600


def test_wall_at_working_inverts_the_clock() -> None:
    pauses = [iv(10, 20), iv(30, 45)]
    assert clock.wall_at_working(T0, pauses, 5) == at(5)
    assert clock.wall_at_working(T0, pauses, 10) == at(10)
    assert clock.wall_at_working(T0, pauses, 15) == at(25)
    assert clock.wall_at_working(T0, pauses, 40) == at(65)
    assert clock.wall_at_working(T0, pauses, 7200, time_scale=3600) == at(2)


def test_wall_at_working_is_unknown_beyond_an_open_pause() -> None:
    assert clock.wall_at_working(T0, [iv(0, None)], 0) == T0  # the start point is reached
    assert clock.wall_at_working(T0, [iv(5, None)], 10) is None
    assert clock.wall_at_working(T0, [iv(20, None)], 10) == at(10)


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 200)), max_size=8),
    st.integers(1, 1500),
    st.sampled_from([1.0, 60.0, 3600.0]),
)
def test_inverse_round_trips(spans: list[tuple[int, int]], target: int, scale: float) -> None:
    pauses = [iv(s, s + d) for s, d in spans]
    wall = clock.wall_at_working(T0, pauses, target * scale, scale)
    assert wall is not None
    assert clock.working_s(T0, pauses, wall, scale) == pytest.approx(target * scale, abs=1e-3)
    # and it is the earliest such time: a moment before, less working time had passed
    before = wall - timedelta(milliseconds=1)
    assert clock.working_s(T0, pauses, before, scale) < target * scale


def test_human_clock_starts_paused_until_first_login(ctx: Context, tmp_path: Path) -> None:
    attempt_id = make_attempt(ctx, human=True)
    sub = tmp_path / "sub"
    sub.mkdir()
    attempts.start(ctx, attempt_id, None, directory_resolver(sub), now=at(0))
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.READY
        assert clock.state(attempt, at(600)).working_s == 0
        assert clock.state(attempt, at(600)).pause_reason is PauseReason.NOT_STARTED
        user_id = attempt.participant.user_id
    with pytest.raises(Conflict, match="first login"):
        attempts.resume(ctx, attempt_id, None, now=at(10))
    assert user_id is not None
    assert attempts.first_login(ctx, attempt_id, user_id, now=at(600))
    assert not attempts.first_login(ctx, attempt_id, user_id, now=at(700))
    attempts.pause(ctx, attempt_id, PauseReason.PARTICIPANT, user_id, "lunch", now=at(1000))
    with pytest.raises(Conflict, match="already paused"):
        attempts.pause(ctx, attempt_id, PauseReason.ADMIN, None, now=at(1100))
    attempts.resume(ctx, attempt_id, user_id, now=at(1300))
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.RUNNING
        state = clock.state(attempt, at(2000))
        assert state.working_s == 2000 - 600 - 300
        paused = clock.paused_by_reason(attempt, at(2000))
        assert paused == {"not_started": 600.0, "participant": 300.0}
        rows = clock.time_used(session, attempt.study_id, at(2000))
        assert [(r.attempt_id, r.working_s) for r in rows] == [(attempt_id, 1100.0)]
        actions = [e.action for e in session.query(AuditEvent).order_by(AuditEvent.id)]
        assert actions[-4:] == [
            "attempt.resume",
            "attempt.first_login",
            "attempt.pause",
            "attempt.resume",
        ]


def test_agent_clock_runs_from_start_and_extension_is_audited(ctx: Context, tmp_path: Path) -> None:
    attempt_id = make_attempt(ctx, limit_hours=1)
    sub = tmp_path / "sub"
    sub.mkdir()
    attempts.start(ctx, attempt_id, None, directory_resolver(sub), now=at(0))
    with pytest.raises(InvalidInput):
        attempts.extend(ctx, attempt_id, -5, None, "oops")
    with pytest.raises(InvalidInput, match="reason"):
        attempts.extend(ctx, attempt_id, 60, None, "  ")
    assert attempts.extend(ctx, attempt_id, 1800, None, "outage compensation") == 5400
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        assert clock.state(attempt, at(30)).working_s == 30
        event = session.query(AuditEvent).filter_by(action="attempt.extend").one()
        assert event.details == {
            "before_s": 3600.0,
            "after_s": 5400.0,
            "reason": "outage compensation",
        }


def test_wall_clock_cap_is_scaled_and_counts_pauses(ctx: Context) -> None:
    attempt_id = make_attempt(ctx, wall_cap_hours=3, time_scale=3600)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.started_at = T0
        attempt.status = AttemptStatus.RUNNING
        clock.start_pause(session, attempt, PauseReason.OUTAGE, None, at=at(1))
        assert clock.wall_cap_at(attempt) == at(3)
        state = clock.state(attempt, at(3))
        assert state.working_s == 3600 and state.wall_cap_reached and not state.limit_reached


def test_time_used_csv_gives_hours_in_total_and_by_reason() -> None:
    row = clock.TimeUsed(
        attempt_id=7,
        participant="Ada",
        pseudonym="P-7",
        kind="human",
        status="running",
        working_s=5400.0,
        paused_s={PauseReason.PARTICIPANT.value: 1800.0, PauseReason.OUTAGE.value: 3600.0},
    )
    header, values = list(csv.reader(io.StringIO(clock.time_used_csv([row]))))
    record = dict(zip(header, values, strict=True))
    assert record["working_hours"] == "1.5000" and record["paused_hours"] == "1.5000"
    assert record[f"paused_{PauseReason.PARTICIPANT.value}_hours"] == "0.5000"
    assert record[f"paused_{PauseReason.OUTAGE.value}_hours"] == "1.0000"
    assert record[f"paused_{PauseReason.ADMIN.value}_hours"] == "0.0000"
