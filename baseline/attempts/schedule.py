"""When snapshots fall due, and taking the ones that have.

Due points live on the working-time axis: the start (0), the study checkpoints (default 2, 8, 32
and 48 working hours), optionally every N working minutes, and the limit, where the final snapshot
is taken and the attempt ends. Their wall times follow from the pauses (see
`baseline.attempts.clock`), so they are recomputed whenever a pause starts or ends. `run_due` is
the one routine that acts: it takes every pending point whose working time has been reached, in
order, marking those taken more than the grace after their due time as late (a portal that was down
catches up on restart), and ends the attempt at its working-time limit or wall-clock cap. It is
idempotent: running it twice, or after a crash, takes nothing twice and misses nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from baseline import audit
from baseline.attempts import clock, family_launch, workspace_freeze
from baseline.attempts.snapshots import (
    LATE_GRACE_WALL_S,
    SourceResolver,
    SubmissionSource,
    take_snapshot,
)
from baseline.context import Context
from baseline.errors import Conflict
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    Attempt,
    AttemptStatus,
    Snapshot,
    SnapshotKind,
    utcnow,
)
from baseline.workspaces import attempt_tokens
from baseline.workspaces.backends import BackendFactory, backend_for_host

log = logging.getLogger(__name__)

# Wall seconds of slack when comparing a due working time with the clock (float rounding).
EPSILON_WALL_S = 1e-3


@dataclass(frozen=True, order=True)
class DuePoint:
    due_working_s: float
    kind: SnapshotKind


def due_points(
    limit_s: float, checkpoint_hours: list[float], interval_minutes: float | None
) -> list[DuePoint]:
    """Start, checkpoints and interval points up to the limit (the final one is `limit_point`)."""
    points = {DuePoint(0.0, SnapshotKind.START)}
    checkpoints = {float(h) * 3600.0 for h in checkpoint_hours if 0 < float(h) * 3600.0 <= limit_s}
    points |= {DuePoint(s, SnapshotKind.CHECKPOINT) for s in checkpoints}
    if interval_minutes:
        step = interval_minutes * 60.0
        count = 1
        while count * step < limit_s:
            due = count * step
            if due not in checkpoints:
                points.add(DuePoint(due, SnapshotKind.INTERVAL))
            count += 1
    return sorted(points)


def attempt_points(attempt: Attempt) -> list[DuePoint]:
    study = attempt.study
    return due_points(
        attempt.working_time_limit_s, list(study.checkpoint_hours), study.snapshot_interval_minutes
    )


def taken(attempt: Attempt) -> set[tuple[SnapshotKind, float]]:
    return {(s.kind, s.due_working_s) for s in attempt.snapshots}


def pending_points(attempt: Attempt) -> list[DuePoint]:
    done = taken(attempt)
    return [p for p in attempt_points(attempt) if (p.kind, p.due_working_s) not in done]


def is_live(attempt: Attempt) -> bool:
    return attempt.started_at is not None and attempt.status in LIVE_ATTEMPT_STATUSES


def next_wall_time(attempt: Attempt) -> datetime | None:
    """The next wall time at which something falls due: a snapshot, the limit, the wall cap."""
    if not is_live(attempt) or attempt.started_at is None:
        return None
    intervals = clock.intervals_of(attempt.pauses)
    targets = [p.due_working_s for p in pending_points(attempt)]
    targets.append(attempt.working_time_limit_s)
    candidates = [
        clock.wall_at_working(attempt.started_at, intervals, t, attempt.time_scale) for t in targets
    ]
    candidates.append(clock.wall_cap_at(attempt))
    known = [c for c in candidates if c is not None]
    return min(known) if known else None


def run_due(
    ctx: Context,
    attempt_id: int,
    resolver: SourceResolver,
    now: datetime | None = None,
    late_grace_wall_s: float = LATE_GRACE_WALL_S,
    backend_factory: BackendFactory = backend_for_host,
) -> list[Snapshot]:
    """Take every snapshot that is due, then end the attempt if its limit or cap is reached
    (its workspace then reached through `backend_factory`, see `finish`).

    Before the limit a failed capture raises (the scheduler retries it). At the limit it cannot
    hold the attempt open: the failure is recorded in the audit log and the attempt ends all
    the same, with whatever snapshots exist.
    """
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None or not is_live(attempt):
            return []
        now = now or utcnow()
        state = clock.state(attempt, now)
        slack = EPSILON_WALL_S * attempt.time_scale
        due = [p for p in pending_points(attempt) if p.due_working_s <= state.working_s + slack]
        ends = state.limit_reached or state.wall_cap_reached
        final_due = min(state.working_s, attempt.working_time_limit_s)
        source: SubmissionSource | None = None
        if due or ends:
            try:
                source = resolver(session, attempt)
            except Exception as exc:
                if not ends:
                    raise
                _record_failure(ctx, attempt_id, "source", exc)
    taken_now = []
    for point in due:
        if source is None:
            break
        try:
            taken_now.append(
                take_snapshot(
                    ctx,
                    attempt_id,
                    point.kind,
                    point.due_working_s,
                    source,
                    now=now,
                    late_grace_wall_s=late_grace_wall_s,
                )
            )
        except Exception as exc:
            if not ends:
                raise
            _record_failure(ctx, attempt_id, point.kind.value, exc)
    if ends:
        final = finish(
            ctx,
            attempt_id,
            AttemptStatus.ENDED,
            "working-time limit reached" if state.limit_reached else "wall-clock cap reached",
            final_due,
            source,
            actor_id=None,
            now=now,
            late_grace_wall_s=late_grace_wall_s,
            backend_factory=backend_factory,
        )
        if final is not None:
            taken_now.append(final)
    return taken_now


def _record_failure(ctx: Context, attempt_id: int, what: str, exc: BaseException) -> None:
    """A capture that failed where the attempt must end regardless: kept in the audit log."""
    log.warning("attempt %s: %s snapshot failed at its end: %s", attempt_id, what, exc)
    with ctx.session() as session:
        audit.record(
            session,
            "snapshot.failed",
            "attempt",
            attempt_id,
            None,
            kind=what,
            error=f"{type(exc).__name__}: {exc}"[:2000],
        )


def finish(
    ctx: Context,
    attempt_id: int,
    status: AttemptStatus,
    reason: str,
    final_due_working_s: float | None,
    source: SubmissionSource | None,
    actor_id: int | None,
    now: datetime | None = None,
    late_grace_wall_s: float = LATE_GRACE_WALL_S,
    backend_factory: BackendFactory = backend_for_host,
) -> Snapshot | None:
    """Take the final snapshot (once per attempt), then stop the clock with the given status;
    then the family's teardown runs in the workspace and the workspace is frozen (a human's) or
    stopped (an agent's), both through `backend_factory` (`workspace_freeze`).

    A submission (``SUBMITTED``) needs its final snapshot: a failed capture raises and the
    participant can submit again. An attempt ended by its limit ends even when the capture
    fails or there is no source (None returned, the failure in the audit log).
    """
    now = now or utcnow()
    with ctx.session() as session:
        final = session.scalar(
            select(Snapshot).where(
                Snapshot.attempt_id == attempt_id, Snapshot.kind == SnapshotKind.FINAL
            )
        )
    if final is None and source is not None:
        try:
            final = take_snapshot(
                ctx,
                attempt_id,
                SnapshotKind.FINAL,
                final_due_working_s,
                source,
                actor_id=actor_id,
                now=now,
                late_grace_wall_s=late_grace_wall_s,
            )
        except Exception as exc:
            if status is not AttemptStatus.ENDED:
                raise
            _record_failure(ctx, attempt_id, SnapshotKind.FINAL.value, exc)
    elif final is None and status is not AttemptStatus.ENDED:
        raise Conflict(f"attempt {attempt_id}: no source to take the final snapshot from")
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        if attempt.status in LIVE_ATTEMPT_STATUSES:
            end_at = _end_wall_time(attempt, status, now)
            for pause in attempt.pauses:
                if pause.ended_at is None:
                    pause.ended_at = max(end_at, pause.started_at)
            attempt.status = status
            attempt.ended_at = end_at
            attempt.end_reason = reason
            attempt_tokens.revoke_all(session, attempt_id, actor_id)
            audit.record(
                session,
                f"attempt.{status.value}",
                "attempt",
                attempt_id,
                actor_id,
                reason=reason,
                final_snapshot_id=None if final is None else final.id,
                working_s=clock.attempt_working_s(attempt, end_at),
            )
    family_launch.run_teardown(ctx, attempt_id, backend_factory)
    workspace_freeze.freeze(ctx, attempt_id, backend_factory)
    return final


def _end_wall_time(attempt: Attempt, status: AttemptStatus, now: datetime) -> datetime:
    """An attempt ended by its limit stops at the limit, even when the portal noticed late."""
    if status is not AttemptStatus.ENDED or attempt.started_at is None:
        return now
    intervals = clock.intervals_of(attempt.pauses)
    candidates = [
        clock.wall_at_working(
            attempt.started_at, intervals, attempt.working_time_limit_s, attempt.time_scale
        ),
        clock.wall_cap_at(attempt),
    ]
    reached = [c for c in candidates if c is not None and c <= now]
    return min(reached) if reached else now
