"""Attempts: list, read, create, and the clock actions of the attempt page.

Object-level visibility is the portal's (`baseline.people.visibility`): a participant sees and acts
on their own attempts only, staff on all; graders and analysts see none (blinding). The clock
actions call the same domain functions as the HTML attempt page, each in its own transaction, so
the request's session is released first and the attempt is read back afterwards.
"""

from __future__ import annotations

from typing import Any

from apiflask import Schema
from apiflask.fields import Boolean, DateTime, Float, Integer, List, Nested, String
from apiflask.validators import Length, OneOf, Range
from flask import g
from marshmallow import pre_dump
from sqlalchemy.orm import selectinload

from app.access import ANY_USER, STAFF, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, commit, context, user
from baseline.attempts import attempts, clock, launch, snapshots
from baseline.errors import Conflict, Forbidden, NotFound
from baseline.models import Attempt, Participant, PauseReason, Role, Task, utcnow
from baseline.people import visibility
from baseline.studies import studies

VIEWERS = (Role.PARTICIPANT, *STAFF)
ACTION_ERRORS = [*AUTH_ERRORS, 404, 409, 422]
# A person pauses for these only; the platform sets the others when it observes them.
STAFF_REASONS = sorted(r.value for r in clock.HELD_REASONS)


class ClockOut(Schema):
    """The working clock now, as the attempt page shows it: what a remote coordinator checks
    after a pause or an extension."""

    working_s = Float(required=True)
    limit_s = Float(required=True)
    remaining_s = Float(required=True)
    paused = Boolean(required=True)
    pause_reason = String(allow_none=True)


class AttemptOut(Schema):
    id = Integer(required=True)
    study_id = Integer(required=True)
    task_id = Integer(required=True)
    participant_id = Integer(required=True)
    status = String(required=True)
    hardware_profile = String(required=True)
    working_time_limit_s = Float(required=True)
    created_at = DateTime(required=True)
    started_at = DateTime(allow_none=True)
    ended_at = DateTime(allow_none=True)
    clock = Nested(ClockOut, required=True)

    @pre_dump
    def _with_clock(self, attempt: Attempt, **_: Any) -> dict[str, Any]:
        state = clock.state(attempt)
        return {
            **{name: getattr(attempt, name) for name in self.fields if name != "clock"},
            "clock": {
                "working_s": state.working_s,
                "limit_s": state.limit_s,
                "remaining_s": state.remaining_s,
                "paused": state.paused,
                "pause_reason": state.pause_reason.value if state.pause_reason else None,
            },
        }


class AttemptListOut(Schema):
    attempts = List(Nested(AttemptOut), required=True)


class AttemptIn(Schema):
    participant_id = Integer(required=True, validate=Range(min=1, max=2**63 - 1))
    task_id = Integer(required=True, validate=Range(min=1, max=2**63 - 1))


class PauseIn(Schema):
    reason = String(load_default=None, allow_none=True, validate=OneOf(STAFF_REASONS))
    note = String(load_default="", validate=Length(0, 500))


class ExtendIn(Schema):
    hours = Float(required=True, validate=Range(min=0, min_inclusive=False, max=1e5))
    reason = String(required=True, validate=Length(1, 500))
    # The limit the client read (working hours): refused with 409 if it changed since, so an
    # extension sent twice adds its hours once.
    seen_limit_hours = Float(validate=Range(min=0, max=1e6))


class SnapshotRef(Schema):
    id = Integer(required=True)
    kind = String(required=True)
    file_count = Integer(required=True)


class ActionOut(Schema):
    attempt = Nested(AttemptOut, required=True)
    message = String(required=True)
    snapshot = Nested(SnapshotRef, allow_none=True)


def _visible(attempt_id: int) -> Attempt:
    return visibility.visible_attempt(g.db, user(), attempt_id)


def _released(attempt_id: int) -> int:
    """Check visibility, then end the request's transaction: the action runs its own."""
    attempt = _visible(attempt_id)
    g.db.rollback()
    return attempt.id


def _done(attempt_id: int, message: str, snapshot: Any = None) -> dict[str, Any]:
    g.db.expire_all()
    ref = None
    if snapshot is not None:
        ref = {"id": snapshot.id, "kind": snapshot.kind.value, "file_count": snapshot.file_count}
    return {"attempt": _visible(attempt_id), "message": message, "snapshot": ref}


def _own_or_staff(attempt: Attempt) -> None:
    caller = user()
    if caller.role not in STAFF and attempt.participant.user_id != caller.id:
        raise NotFound(f"no attempt with id {attempt.id}")


@bp.get("/attempts")
@requires(*ANY_USER)
@bp.output(AttemptListOut)
@bp.doc(summary="Attempts the caller may see", responses=AUTH_ERRORS, security=BEARER)
def list_attempts() -> Any:
    # Each attempt's clock reads its pauses: loaded in one query, not one per attempt.
    query = visibility.attempts_query(user()).options(selectinload(Attempt.pauses))
    return {"attempts": list(g.db.scalars(query))}


@bp.get("/attempts/<int:attempt_id>")
@requires(*ANY_USER)
@bp.output(AttemptOut)
@bp.doc(summary="One attempt", responses=AUTH_ERRORS, security=BEARER)
def get_attempt(attempt_id: int) -> Any:
    return _visible(attempt_id)


@bp.post("/studies/<int:study_id>/attempts")
@requires(*STAFF)
@bp.input(AttemptIn, arg_name="body")
@bp.output(AttemptOut, status_code=201)
@bp.doc(
    summary="Assign a task of the study to one of its participants",
    responses=[*AUTH_ERRORS, 404, 422],
    security=BEARER,
)
def create_attempt(study_id: int, body: dict[str, Any]) -> Any:
    study = studies.get_study(g.db, study_id)
    participant = g.db.get(Participant, body["participant_id"])
    if participant is None or participant.study_id != study.id:
        raise NotFound(f"study {study.id} has no participant {body['participant_id']}")
    task = g.db.get(Task, body["task_id"])
    if task is None:
        raise NotFound(f"no task with id {body['task_id']}")
    attempt = studies.create_attempt(g.db, participant, task, user().id)
    commit()
    return attempt


@bp.post("/attempts/<int:attempt_id>/launch")
@requires(*STAFF)
@bp.output(ActionOut)
@bp.doc(
    summary="Place the workspace and start the clock (stays pending while no host has room)",
    responses=ACTION_ERRORS,
    security=BEARER,
)
def launch_attempt(attempt_id: int) -> Any:
    attempt_id = _released(attempt_id)
    status = launch.launch(context(), attempt_id, user().id)
    return _done(attempt_id, f"the attempt is {status.value}")


@bp.post("/attempts/<int:attempt_id>/pause")
@requires(*VIEWERS)
@bp.input(PauseIn, arg_name="body")
@bp.output(ActionOut)
@bp.doc(
    summary="Pause the working clock (participants: their own attempt, reason 'participant')",
    responses=ACTION_ERRORS,
    security=BEARER,
)
def pause(attempt_id: int, body: dict[str, Any]) -> Any:
    attempt = _visible(attempt_id)
    _own_or_staff(attempt)
    if user().role in STAFF:
        reason = PauseReason(body["reason"] or PauseReason.ADMIN.value)
    elif body["reason"] not in (None, PauseReason.PARTICIPANT.value):
        raise Forbidden("a participant pauses for reason 'participant' only")
    else:
        reason = PauseReason.PARTICIPANT
    attempt_id = _released(attempt_id)
    attempts.pause(context(), attempt_id, reason, user().id, body["note"])
    return _done(attempt_id, f"clock paused ({reason.value})")


@bp.post("/attempts/<int:attempt_id>/resume")
@requires(*VIEWERS)
@bp.output(ActionOut)
@bp.doc(summary="Resume the working clock", responses=ACTION_ERRORS, security=BEARER)
def resume(attempt_id: int) -> Any:
    attempt = _visible(attempt_id)
    _own_or_staff(attempt)
    current = clock.open_pause(attempt)
    team_pause = current is not None and current.reason is not PauseReason.PARTICIPANT
    if user().role not in STAFF and current is not None and team_pause:
        raise Forbidden(
            f"this pause ({current.reason.value}) was set by the study team; they resume it"
        )
    attempt_id = _released(attempt_id)
    attempts.resume(context(), attempt_id, user().id)
    return _done(attempt_id, "clock resumed")


@bp.post("/attempts/<int:attempt_id>/extend")
@requires(*STAFF)
@bp.input(ExtendIn, arg_name="body")
@bp.output(ActionOut)
@bp.doc(
    summary="Extend the working-time limit (with seen_limit_hours: only if it is still that)",
    responses=ACTION_ERRORS,
    security=BEARER,
)
def extend(attempt_id: int, body: dict[str, Any]) -> Any:
    attempt_id = _released(attempt_id)
    seen = body.get("seen_limit_hours")
    limit = attempts.extend(
        context(),
        attempt_id,
        body["hours"] * 3600.0,
        user().id,
        body["reason"].strip(),
        None if seen is None else seen * 3600.0,
    )
    return _done(attempt_id, f"limit is now {limit / 3600:g} working hours")


class ReasonIn(Schema):
    reason = String(required=True, validate=Length(1, 500))


@bp.post("/attempts/<int:attempt_id>/disqualify")
@requires(*STAFF)
@bp.input(ReasonIn, arg_name="body")
@bp.output(ActionOut)
@bp.doc(
    summary="Disqualify: stop the clock for good (snapshots kept as evidence)",
    responses=ACTION_ERRORS,
    security=BEARER,
)
def disqualify(attempt_id: int, body: dict[str, Any]) -> Any:
    attempt_id = _released(attempt_id)
    attempts.disqualify(context(), attempt_id, user().id, body["reason"].strip())
    return _done(attempt_id, "disqualified")


class WithdrawnOut(Schema):
    withdrawn = Integer(required=True)
    message = String(required=True)


@bp.post("/attempts/<int:attempt_id>/withdraw")
@requires(*STAFF)
@bp.input(ReasonIn, arg_name="body")
@bp.output(WithdrawnOut)
@bp.doc(
    summary="Withdraw an attempt that never started (assigned by mistake): removed, audited",
    responses=ACTION_ERRORS,
    security=BEARER,
)
def withdraw(attempt_id: int, body: dict[str, Any]) -> Any:
    attempt_id = _released(attempt_id)
    attempts.withdraw(context(), attempt_id, user().id, body["reason"].strip())
    return {"withdrawn": attempt_id, "message": f"attempt {attempt_id} withdrawn"}


@bp.post("/attempts/<int:attempt_id>/snapshot")
@requires(*STAFF)
@bp.output(ActionOut, status_code=201)
@bp.doc(summary="Take a manual snapshot now", responses=ACTION_ERRORS, security=BEARER)
def take_snapshot(attempt_id: int) -> Any:
    attempt_id = _released(attempt_id)
    asked_at = utcnow()
    taken = attempts.manual_snapshot(context(), attempt_id, user().id, snapshots.resolve_source)
    return _done(attempt_id, snapshots.taken_message(taken, asked_at), taken)


@bp.post("/attempts/<int:attempt_id>/submit")
@requires(*VIEWERS)
@bp.output(ActionOut)
@bp.doc(
    summary="Submit: take the final snapshot and stop the clock",
    responses=ACTION_ERRORS,
    security=BEARER,
)
def submit(attempt_id: int) -> Any:
    attempt = _visible(attempt_id)
    _own_or_staff(attempt)
    if attempt.ended_at is not None:
        raise Conflict(f"attempt {attempt.id} has ended already ({attempt.status.value})")
    attempt_id = _released(attempt_id)
    final = attempts.submit(context(), attempt_id, user().id, snapshots.resolve_source)
    return _done(attempt_id, f"submitted; final snapshot {final.id}", final)
