"""The working-time clock of an attempt.

The study's result is "score at working time t", so working time must be exact and reproducible
from stored facts only: the attempt's start, its pause rows and its time scale. Working time is
wall time since the start minus the union of the pause intervals, multiplied by the attempt's time
scale (working seconds per wall second; 1 in a real study, e.g. 3600 in a dry run where one wall
second stands for one working hour). A human's clock starts paused (reason ``not_started``) until
the first login; an agent's runs from its start. The wall-clock cap is measured on the same scaled
axis but ignores pauses.

The pure functions below take pause intervals and never read the database; the helpers at the end
load an attempt's pauses, open and close pauses, and extend the limit (audited).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.errors import Conflict, InvalidInput
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    Attempt,
    AttemptStatus,
    Pause,
    PauseReason,
    utcnow,
)

# The pauses a person opens (the participant's break, the study team's pause) hold a human's
# workspace still (`baseline.attempts.workspace_freeze.hold`). Those the platform opens do not:
# `idle` ends at the next activity in the workspace (`baseline.hub.hub_watch`), an `outage` is
# the hub or host being unreachable, `not_started` precedes the first login, and `scoring` scores
# a copy in its own container.
HELD_REASONS = frozenset({PauseReason.PARTICIPANT, PauseReason.ADMIN})


@dataclass(frozen=True)
class Interval:
    """One pause; ``end`` is None while it is still open."""

    start: datetime
    end: datetime | None
    reason: PauseReason = PauseReason.ADMIN


def merge(intervals: Iterable[Interval], now: datetime) -> list[tuple[datetime, datetime]]:
    """The union of the pauses as sorted, disjoint (start, end) pairs; open pauses end at now."""
    spans = sorted((i.start, i.end if i.end is not None else max(now, i.start)) for i in intervals)
    merged: list[tuple[datetime, datetime]] = []
    for start, end in spans:
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def paused_wall_s(
    intervals: Iterable[Interval], since: datetime, until: datetime, now: datetime
) -> float:
    """Wall seconds of [since, until] covered by at least one pause."""
    total = 0.0
    for start, end in merge(intervals, now):
        lo, hi = max(start, since), min(end, until)
        if hi > lo:
            total += (hi - lo).total_seconds()
    return total


def working_s(
    started_at: datetime | None,
    intervals: Sequence[Interval],
    at: datetime,
    time_scale: float = 1.0,
) -> float:
    """Working seconds at wall time ``at`` (0 before the start)."""
    if started_at is None or at <= started_at:
        return 0.0
    wall = (at - started_at).total_seconds()
    return (wall - paused_wall_s(intervals, started_at, at, now=at)) * time_scale


def wall_at_working(
    started_at: datetime,
    intervals: Sequence[Interval],
    target_working_s: float,
    time_scale: float = 1.0,
) -> datetime | None:
    """The wall time at which working time reaches the target, given the known pauses.

    Pauses still open never end as far as this function knows, so a target beyond an open pause
    returns None: it is recomputed when the pause ends. Future pauses are unknown and assumed
    absent, which is why the schedule is recomputed whenever a pause starts or ends.
    """
    remaining_wall = max(target_working_s, 0.0) / time_scale
    cursor = started_at
    open_end = datetime.max.replace(tzinfo=started_at.tzinfo)
    for start, end in merge(intervals, now=open_end):
        if end <= cursor:
            continue
        start = max(start, cursor)
        run = (start - cursor).total_seconds()
        if run >= remaining_wall:
            break
        remaining_wall -= run
        if end == open_end:
            return None
        cursor = end
    return cursor + timedelta(seconds=remaining_wall)


def wall_cap_at(attempt: Attempt) -> datetime | None:
    """Wall time at which the wall-clock cap is reached (pauses count; the time scale applies)."""
    if attempt.started_at is None or attempt.wall_clock_limit_s is None:
        return None
    return attempt.started_at + timedelta(seconds=attempt.wall_clock_limit_s / attempt.time_scale)


@dataclass(frozen=True)
class ClockState:
    """What a coordinator sees: everything derived from the stored rows at one instant."""

    at: datetime
    working_s: float
    limit_s: float
    paused: bool
    pause_reason: PauseReason | None
    paused_wall_s: float
    scaled_wall_s: float
    wall_cap_s: float | None

    @property
    def remaining_s(self) -> float:
        return max(self.limit_s - self.working_s, 0.0)

    @property
    def limit_reached(self) -> bool:
        return self.working_s >= self.limit_s

    @property
    def wall_cap_reached(self) -> bool:
        return self.wall_cap_s is not None and self.scaled_wall_s >= self.wall_cap_s


def intervals_of(pauses: Iterable[Pause]) -> list[Interval]:
    return [Interval(p.started_at, p.ended_at, p.reason) for p in pauses]


def open_pause(attempt: Attempt) -> Pause | None:
    for pause in attempt.pauses:
        if pause.ended_at is None:
            return pause
    return None


def end_time(attempt: Attempt) -> datetime | None:
    """The clock stops for good when the attempt ends."""
    return attempt.ended_at if attempt.status not in LIVE_ATTEMPT_STATUSES else None


def state(attempt: Attempt, now: datetime | None = None) -> ClockState:
    now = now or utcnow()
    stop = end_time(attempt)
    at = min(now, stop) if stop is not None else now
    intervals = intervals_of(attempt.pauses)
    current = open_pause(attempt)
    started = attempt.started_at
    paused = 0.0 if started is None else paused_wall_s(intervals, started, at, now=at)
    wall = 0.0 if started is None or at <= started else (at - started).total_seconds()
    return ClockState(
        at=at,
        working_s=working_s(started, intervals, at, attempt.time_scale),
        limit_s=attempt.working_time_limit_s,
        paused=current is not None and stop is None,
        pause_reason=current.reason if current is not None and stop is None else None,
        paused_wall_s=paused,
        scaled_wall_s=wall * attempt.time_scale,
        wall_cap_s=attempt.wall_clock_limit_s,
    )


def attempt_working_s(attempt: Attempt, at: datetime | None = None) -> float:
    return state(attempt, at).working_s


def paused_by_reason(attempt: Attempt, now: datetime | None = None) -> dict[str, float]:
    """Scaled seconds spent in each kind of pause (overlaps counted under each reason)."""
    now = now or utcnow()
    stop = end_time(attempt)
    until = min(now, stop) if stop is not None else now
    totals: dict[str, float] = {}
    for pause in attempt.pauses:
        end = pause.ended_at or until
        seconds = max((min(end, until) - pause.started_at).total_seconds(), 0.0)
        key = pause.reason.value
        totals[key] = totals.get(key, 0.0) + seconds * attempt.time_scale
    return totals


# -- database helpers -------------------------------------------------------------------------


def start_pause(
    session: Session,
    attempt: Attempt,
    reason: PauseReason,
    actor_id: int | None,
    note: str = "",
    at: datetime | None = None,
) -> Pause:
    """Open a pause. One pause is open at a time, so the clock's state is never ambiguous."""
    at = at or utcnow()
    if attempt.status not in LIVE_ATTEMPT_STATUSES:
        raise Conflict(f"attempt {attempt.id} is {attempt.status.value}: its clock has stopped")
    current = open_pause(attempt)
    if current is not None:
        raise Conflict(
            f"attempt {attempt.id} is already paused ({current.reason.value}) "
            f"since {current.started_at.isoformat(timespec='seconds')}"
        )
    pause = Pause(attempt=attempt, started_at=at, reason=reason, note=note)
    session.add(pause)
    if attempt.status is AttemptStatus.RUNNING:
        attempt.status = AttemptStatus.PAUSED
    session.flush()
    audit.record(
        session, "attempt.pause", "attempt", attempt.id, actor_id, reason=reason.value, note=note
    )
    return pause


def record_gap(
    session: Session, attempt: Attempt, start: datetime, end: datetime, reason: PauseReason,
    note: str,
) -> Pause | None:  # fmt: skip
    """Record a pause that is over already: a span nobody could open a pause for as it began
    (an agent's driver died; the next one knows when it last showed life). Working time inside
    it is not charged. None when the span is empty."""
    start = max(start, attempt.started_at or start)
    if end <= start:
        return None
    pause = Pause(attempt=attempt, started_at=start, ended_at=end, reason=reason, note=note)
    session.add(pause)
    session.flush()
    audit.record(session, "attempt.gap", "attempt", attempt.id, None, reason=reason.value,
                 note=note, paused_s=(end - start).total_seconds())  # fmt: skip
    return pause


def end_pause(
    session: Session,
    attempt: Attempt,
    actor_id: int | None,
    at: datetime | None = None,
    allow_not_started: bool = False,
) -> Pause:
    """Close the open pause. The ``not_started`` pause only ends at the first login."""
    at = at or utcnow()
    current = open_pause(attempt)
    if current is None:
        raise Conflict(f"attempt {attempt.id} is not paused")
    if current.reason is PauseReason.NOT_STARTED and not allow_not_started:
        raise Conflict(f"attempt {attempt.id} has not started: its clock runs from the first login")
    current.ended_at = max(at, current.started_at)
    if attempt.status in (AttemptStatus.PAUSED, AttemptStatus.READY):
        attempt.status = AttemptStatus.RUNNING
    session.flush()
    audit.record(
        session,
        "attempt.resume",
        "attempt",
        attempt.id,
        actor_id,
        reason=current.reason.value,
        paused_s=(current.ended_at - current.started_at).total_seconds(),
    )
    return current


def extend_limit(
    session: Session,
    attempt: Attempt,
    extra_working_s: float,
    actor_id: int | None,
    reason: str,
    seen_limit_s: float | None = None,
) -> float:
    """Add working time to the limit; the reason is kept in the audit trail.

    An extension is relative, so one asked twice (a double click, two coordinators handling
    the same incident) would add its time twice and give this participant more time than the
    study's others. With `seen_limit_s`, the limit the asker saw, it is refused when the limit
    has changed since."""
    if not extra_working_s > 0:
        raise InvalidInput(
            f"extension: must be a positive number of seconds, got {extra_working_s}"
        )
    if not reason.strip():
        raise InvalidInput("extension: a reason is required")
    if attempt.status not in LIVE_ATTEMPT_STATUSES:
        raise Conflict(f"attempt {attempt.id} is {attempt.status.value}: it cannot be extended")
    before = attempt.working_time_limit_s
    if seen_limit_s is not None and abs(seen_limit_s - before) > 1e-6:
        raise Conflict(
            f"the limit is {before / 3600:g} working hours now, not {seen_limit_s / 3600:g} as "
            "when you asked: it was extended since, so nothing was added (reload, and extend "
            "again if more time is still due)"
        )
    attempt.working_time_limit_s = before + extra_working_s
    session.flush()
    audit.record(
        session,
        "attempt.extend",
        "attempt",
        attempt.id,
        actor_id,
        before_s=before,
        after_s=attempt.working_time_limit_s,
        reason=reason.strip(),
    )
    return attempt.working_time_limit_s


@dataclass(frozen=True)
class TimeUsed:
    """One row of the payout export: working time used, net of pauses."""

    attempt_id: int
    participant: str
    pseudonym: str
    kind: str
    status: str
    working_s: float
    paused_s: dict[str, float]


def time_used(session: Session, study_id: int, now: datetime | None = None) -> list[TimeUsed]:
    now = now or utcnow()
    attempts = session.scalars(
        select(Attempt).where(Attempt.study_id == study_id).order_by(Attempt.id)
    )
    return [
        TimeUsed(
            attempt_id=a.id,
            participant=a.participant.display_name,
            pseudonym=a.participant.pseudonym,
            kind=a.participant.kind.value,
            status=a.status.value,
            working_s=attempt_working_s(a, now),
            paused_s=paused_by_reason(a, now),
        )
        for a in attempts
    ]


def time_used_csv(rows: Iterable[TimeUsed]) -> str:
    """The payout CSV: one row per attempt, hours net of pauses, paused hours (total, by reason).

    The portal download and `baseline attempt time --csv` both write this, so a coordinator gets
    the same columns whichever they use.
    """
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(
        ["attempt_id", "participant", "pseudonym", "kind", "status", "working_hours"]
        + ["paused_hours"]
        + [f"paused_{reason.value}_hours" for reason in PauseReason]
    )
    for row in rows:
        writer.writerow(
            [row.attempt_id, row.participant, row.pseudonym, row.kind, row.status]
            + [f"{row.working_s / 3600:.4f}", f"{sum(row.paused_s.values()) / 3600:.4f}"]
            + [f"{row.paused_s.get(reason.value, 0.0) / 3600:.4f}" for reason in PauseReason]
        )
    return out.getvalue()
