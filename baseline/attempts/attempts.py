"""The attempt lifecycle: start, first login, pause/resume, extend, submit, end, disqualify;
and withdrawing one that never started.

Each action runs in its own transaction, is audited, and then tells the in-process scheduler
(if any, through `clock_listener`) to recompute the attempt's next due time, because every one of
them moves the clock.
Workspace provisioning belongs to the workspace layer: `start` takes a ready submission source
resolver and only starts the clock and takes the start snapshot.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from agents import command
from baseline import audit
from baseline.attempts import clock, clock_listener, schedule, workspace_freeze
from baseline.attempts.snapshots import SourceResolver, take_snapshot
from baseline.context import Context
from baseline.errors import Conflict, InvalidInput, NotFound
from baseline.models import (
    Attempt,
    AttemptStatus,
    ParticipantKind,
    Pause,
    PauseReason,
    Snapshot,
    SnapshotKind,
    Workspace,
    WorkspaceStatus,
    utcnow,
)
from baseline.studies import studies
from baseline.workspaces import attempt_tokens, workspaces
from baseline.workspaces.backends import BackendFactory, backend_for_host

log = logging.getLogger(__name__)


def _get(session: Session, attempt_id: int) -> Attempt:
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        raise NotFound(f"no attempt with id {attempt_id}")
    return attempt


def start(
    ctx: Context,
    attempt_id: int,
    actor_id: int | None,
    resolver: SourceResolver,
    now: datetime | None = None,
    wait_for_driver: bool = False,
) -> list[Snapshot]:
    """Start the clock: an agent's runs now, a human's stays paused until the first login.
    With `wait_for_driver` (a launch) a worker-driven agent's clock stays paused too, until its
    driver starts (`baseline.runs.driver_clock`): the wait for the worker's poll is not work."""
    now = now or utcnow()
    with ctx.session() as session:
        attempt = _get(session, attempt_id)
        # READY: the workspace layer placed the workspace before the clock started.
        startable = (AttemptStatus.PENDING, AttemptStatus.READY)
        if attempt.started_at is not None or attempt.status not in startable:
            raise Conflict(f"attempt {attempt_id} has started already ({attempt.status.value})")
        attempt.started_at = now
        studies.activate_on_first_start(session, attempt.study, actor_id)
        if attempt.participant.kind is ParticipantKind.HUMAN:
            attempt.status = AttemptStatus.READY
            session.add(
                Pause(
                    attempt=attempt,
                    started_at=now,
                    reason=PauseReason.NOT_STARTED,
                    note="waiting for the first login",
                )
            )
        else:
            attempt.status = AttemptStatus.RUNNING
            if wait_for_driver and command.worker_driven(attempt.participant.agent_scaffold):
                session.add(Pause(attempt=attempt, started_at=now, reason=PauseReason.NOT_STARTED,
                                  note="waiting for its agent's driver"))  # fmt: skip
        audit.record(session, "attempt.start", "attempt", attempt_id, actor_id)
    try:
        taken = schedule.run_due(ctx, attempt_id, resolver, now=now)
    except Conflict as exc:
        # The clock has started either way; the scheduler retries the start snapshot.
        log.warning("attempt %s started, start snapshot deferred: %s", attempt_id, exc)
        taken = []
    clock_listener.clock_changed(attempt_id)
    return taken


def first_login(ctx: Context, attempt_id: int, user_id: int, now: datetime | None = None) -> bool:
    """End the ``not_started`` pause; True when this call started the clock (idempotent)."""
    with ctx.session() as session:
        attempt = _get(session, attempt_id)
        current = clock.open_pause(attempt)
        if attempt.first_login_at is not None or current is None:
            return False
        if current.reason is not PauseReason.NOT_STARTED:
            return False
        at = now or utcnow()
        clock.end_pause(session, attempt, user_id, at=at, allow_not_started=True)
        attempt.first_login_at = at
        audit.record(session, "attempt.first_login", "attempt", attempt_id, user_id)
    clock_listener.clock_changed(attempt_id)
    return True


def end_idle(
    ctx: Context, attempt_id: int, actor_id: int | None, now: datetime | None = None
) -> bool:
    """End an ``idle`` pause (the participant is back); True when one was open."""
    with ctx.session() as session:
        attempt = _get(session, attempt_id)
        current = clock.open_pause(attempt)
        if current is None or current.reason is not PauseReason.IDLE:
            return False
        clock.end_pause(session, attempt, actor_id, at=now)
    clock_listener.clock_changed(attempt_id)
    return True


def pause(
    ctx: Context,
    attempt_id: int,
    reason: PauseReason,
    actor_id: int | None,
    note: str = "",
    now: datetime | None = None,
) -> None:
    if reason is PauseReason.NOT_STARTED:
        raise Conflict("the not_started pause is opened by the start of an attempt only")
    with ctx.session() as session:
        clock.start_pause(session, _get(session, attempt_id), reason, actor_id, note, at=now)
    clock_listener.clock_changed(attempt_id)
    if reason in clock.HELD_REASONS:
        workspace_freeze.hold(ctx, attempt_id)


def resume(
    ctx: Context, attempt_id: int, actor_id: int | None, now: datetime | None = None
) -> None:
    with ctx.session() as session:
        attempt = _get(session, attempt_id)
        current = clock.open_pause(attempt)
        held = current is not None and current.reason in clock.HELD_REASONS
        clock.end_pause(session, attempt, actor_id, at=now)
    clock_listener.clock_changed(attempt_id)
    if held:
        workspace_freeze.release(ctx, attempt_id)


def resume_if(ctx: Context, attempt_id: int, reason: PauseReason, actor_id: int | None) -> bool:
    """End the attempt's open pause only if it is one of `reason` (Baseline's own, such as an
    intermediate score's); False when none such is open. `resume` ends whatever pause is open:
    for the work that opened a pause of its own, one a coordinator opened after it ended (or
    recovery ended it) is not its to end."""
    with ctx.session() as session:
        attempt = _get(session, attempt_id)
        current = clock.open_pause(attempt)
        if current is None or current.reason is not reason:
            return False
        clock.end_pause(session, attempt, actor_id)
    clock_listener.clock_changed(attempt_id)
    if reason in clock.HELD_REASONS:
        workspace_freeze.release(ctx, attempt_id)
    return True


def extend(
    ctx: Context,
    attempt_id: int,
    extra_working_s: float,
    actor_id: int | None,
    reason: str,
    seen_limit_s: float | None = None,
) -> float:
    """Add working time to the limit (`clock.extend_limit`: refused when `seen_limit_s` is given
    and the limit changed since)."""
    with ctx.session() as session:
        limit = clock.extend_limit(
            session, _get(session, attempt_id), extra_working_s, actor_id, reason, seen_limit_s
        )
    clock_listener.clock_changed(attempt_id)
    return limit


def manual_snapshot(
    ctx: Context, attempt_id: int, actor_id: int | None, resolver: SourceResolver
) -> Snapshot:
    with ctx.session() as session:
        attempt = _get(session, attempt_id)
        if not schedule.is_live(attempt):
            raise Conflict(f"attempt {attempt_id} is {attempt.status.value}: nothing to snapshot")
        source = resolver(session, attempt)
    return take_snapshot(ctx, attempt_id, SnapshotKind.MANUAL, None, source, actor_id=actor_id)


def submit(
    ctx: Context,
    attempt_id: int,
    actor_id: int | None,
    resolver: SourceResolver,
    now: datetime | None = None,
    backend_factory: BackendFactory = backend_for_host,
) -> Snapshot:
    """The participant is done: take the final snapshot, then stop the clock (the workspace is
    then reached through `backend_factory`: `schedule.finish`)."""
    with ctx.session() as session:
        attempt = _get(session, attempt_id)
        if not schedule.is_live(attempt):
            raise Conflict(
                f"attempt {attempt_id} is {attempt.status.value}: it cannot be submitted"
            )
        source = resolver(session, attempt)
    final = schedule.finish(
        ctx, attempt_id, AttemptStatus.SUBMITTED, "submitted", None, source, actor_id, now=now,
        backend_factory=backend_factory,
    )  # fmt: skip
    assert final is not None  # a submission without its final snapshot raises instead
    clock_listener.clock_changed(attempt_id)
    return final


def end_at_limit(ctx: Context, attempt_id: int, resolver: SourceResolver) -> list[Snapshot]:
    """Take whatever is due; ends the attempt when its limit or cap has been reached."""
    taken = schedule.run_due(ctx, attempt_id, resolver)
    clock_listener.clock_changed(attempt_id)
    return taken


def disqualify(
    ctx: Context,
    attempt_id: int,
    actor_id: int | None,
    reason: str,
    backend_factory: BackendFactory = backend_for_host,
) -> None:
    """Stop the clock for good; the snapshots already taken are kept as evidence. The workspace
    is frozen as at any end (`workspace_freeze`): a person's processes end and the submission
    turns read-only (left as it was, a disqualified participant went on changing it); an agent's
    workspace is stopped, no agent working in it any more."""
    if not reason.strip():
        raise Conflict("disqualifying an attempt needs a reason")
    with ctx.session() as session:
        attempt = _get(session, attempt_id)
        if attempt.status is AttemptStatus.DISQUALIFIED:
            return
        studies.check_not_archived(attempt.study, "disqualify its attempts")
        now = utcnow()
        current = clock.open_pause(attempt)
        if current is not None:
            current.ended_at = now
        attempt.status = AttemptStatus.DISQUALIFIED
        attempt.ended_at = attempt.ended_at or now
        attempt.end_reason = reason.strip()
        attempt_tokens.revoke_all(session, attempt_id, actor_id)
        audit.record(
            session, "attempt.disqualify", "attempt", attempt_id, actor_id, reason=reason.strip()
        )
    workspace_freeze.freeze(ctx, attempt_id, backend_factory)
    clock_listener.clock_changed(attempt_id)


def withdraw(ctx: Context, attempt_id: int, actor_id: int | None, reason: str) -> None:
    """Remove an attempt that never started: one assigned by mistake (the wrong task or
    participant, one run too many). Nothing ended a pending attempt, so it stayed in the study,
    its participant's list and the monitor for good, and a launch could still start it.

    It has no clock, snapshot or run to keep, so its row goes; the audit trail keeps who
    withdrew it, why, and whose attempt on which task it was. One launched and waiting for a host
    is withdrawn with its workspace request, unless a host is taking it up right now. A started
    attempt is refused: its work is a result (disqualify it, or let it end)."""
    if not reason.strip():
        raise InvalidInput("withdrawing an attempt needs a reason")
    with ctx.session() as session:
        attempt = _get(session, attempt_id)
        if attempt.status is not AttemptStatus.PENDING or attempt.started_at is not None:
            raise Conflict(
                f"attempt {attempt_id} was launched ({attempt.status.value}): only an attempt "
                "never launched, or waiting for a host, is withdrawn (disqualify it with your "
                "reason, or let it end)"
            )
        studies.check_not_archived(attempt.study, "withdraw its attempts")
        requested = session.scalars(
            select(Workspace).where(
                Workspace.attempt_id == attempt_id, Workspace.status != WorkspaceStatus.DESTROYED
            )
        ).all()
        for workspace in requested:
            seen = WorkspaceStatus.PENDING
            if not workspaces.retire(session, workspace, seen, "attempt withdrawn"):
                raise Conflict(
                    f"attempt {attempt_id}'s workspace is being placed on a host now "
                    f"({workspace.status.value}): it cannot be withdrawn; once it is ready, "
                    "disqualify it with your reason"
                )
        audit.record(
            session,
            "attempt.withdraw",
            "attempt",
            attempt_id,
            actor_id,
            reason=reason.strip(),
            participant=attempt.participant.pseudonym,
            task=attempt.task.slug,
            study_id=attempt.study_id,
        )
        session.delete(attempt)


def agent_run_failed(
    ctx: Context, attempt_id: int, backend_factory: BackendFactory = backend_for_host
) -> str | None:
    """The agent's run failed (its model past its retries, its workspace gone): no attempt gets
    a second run, so nothing will work in its workspace again, which is stopped and its GPUs
    freed. The clock runs on to the limit, and the snapshots still due are taken from the kept
    submission. Returns what could not be done (also audited)."""
    return workspace_freeze.stop_agent_workspace(ctx, attempt_id, backend_factory)
