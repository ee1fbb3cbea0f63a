"""REST API under /api/v1.

Authentication is by per-user bearer token only (no session cookie), so the API needs no CSRF
protection. Every error is JSON `{"error": ..., "message": ...}` with a 4xx code, and every
response is declared in the OpenAPI document at /api/v1/openapi.json (schemathesis checks it).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from apiflask import APIBlueprint, Schema
from apiflask.fields import Boolean, DateTime, Dict, Float, Integer, List, Nested, String
from apiflask.validators import Length, OneOf, Range
from flask import g, url_for
from sqlalchemy import select, text

from app.access import ANY_USER, PUBLIC, STAFF, current_user, requires
from baseline import accounts, agent_enrolment, studies, visibility
from baseline.errors import Forbidden
from baseline.models import (
    EgressPolicy,
    Participant,
    Role,
    StudyStatus,
    Task,
    User,
)

bp = APIBlueprint("api", __name__, url_prefix="/api/v1")
CSRF_EXEMPT = True

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
}
BEARER: list[str | dict[str, list[Any]]] = [{"bearer": []}]
AUTH_ERRORS = [401, 403]
# Decorator order on every route: the route, then @requires, then input/output/doc. The role
# check must run before input validation, or a refused caller would learn the input schema.


def _user() -> User:
    user = current_user()
    assert user is not None  # guaranteed by @requires
    return user


def _commit() -> None:
    g.db.commit()


# --- schemas -------------------------------------------------------------------------------


class HealthOut(Schema):
    status = String(required=True)
    database = String(required=True)


class UserOut(Schema):
    id = Integer(required=True)
    email = String(required=True)
    name = String(required=True)
    role = String(required=True)
    active = Boolean(required=True)


class UserIn(Schema):
    email = String(required=True, validate=Length(3, 320))
    name = String(required=True, validate=Length(1, 200))
    password = String(required=True, validate=Length(8, 200))
    role = String(required=True, validate=OneOf([r.value for r in Role]))


class StudyOut(Schema):
    id = Integer(required=True)
    name = String(required=True)
    description = String(required=True)
    status = String(required=True)
    hardware_profile = String(required=True)
    checkpoint_hours = List(Float(), required=True)
    snapshot_interval_minutes = Float(allow_none=True)
    working_time_limit_hours = Float(required=True)
    wall_clock_limit_hours = Float(allow_none=True)
    time_scale = Float(required=True)
    egress_policy = String(required=True)
    reproduction_timeout_minutes = Float(required=True)
    created_at = DateTime(required=True)


class StudyIn(Schema):
    name = String(required=True, validate=Length(1, 200))
    description = String(load_default="", validate=Length(0, 10000))
    hardware_profile = String(load_default="cpu", validate=Length(1, 64))
    checkpoint_hours = List(
        Float(validate=Range(min=0, min_inclusive=False, max=1e6)),
        load_default=[2.0, 8.0, 32.0, 48.0],
        validate=Length(0, 100),
    )
    snapshot_interval_minutes = Float(
        load_default=None, allow_none=True, validate=Range(min=0, min_inclusive=False, max=1e6)
    )
    working_time_limit_hours = Float(
        load_default=48.0, validate=Range(min=0, min_inclusive=False, max=1e6)
    )
    wall_clock_limit_hours = Float(
        load_default=None, allow_none=True, validate=Range(min=0, min_inclusive=False, max=1e6)
    )
    time_scale = Float(load_default=1.0, validate=Range(min=0, min_inclusive=False, max=1e9))
    egress_policy = String(
        load_default="blacklist", validate=OneOf([p.value for p in EgressPolicy])
    )
    reproduction_timeout_minutes = Float(
        load_default=720.0, validate=Range(min=0, min_inclusive=False, max=1e6)
    )


class StudyPatch(Schema):
    status = String(required=True, validate=OneOf([s.value for s in StudyStatus]))


class ParticipantOut(Schema):
    id = Integer(required=True)
    kind = String(required=True)
    display_name = String(required=True)
    pseudonym = String(required=True)
    group = String(required=True)
    agent_model = String(allow_none=True)
    agent_scaffold = String(allow_none=True)


class AgentIn(Schema):
    name = String(required=True, validate=Length(1, 200))
    scaffold = String(required=True, validate=Length(1, 100))
    model = String(required=True, validate=Length(1, 200))
    endpoint = String(load_default="", validate=Length(0, 500))
    limits = Dict(load_default=dict)


class AgentEnrolmentIn(Schema):
    name = String(required=True, validate=Length(1, 200))
    scaffold = String(required=True, validate=Length(1, 100))
    model = String(required=True, validate=Length(1, 200))
    endpoint = String(required=True, validate=Length(1, 500))
    settings = Dict(load_default=dict)
    runs_per_task = Integer(
        load_default=1, validate=Range(min=1, max=agent_enrolment.MAX_RUNS_PER_TASK)
    )


class AgentEnrolmentOut(Schema):
    participant = Nested(ParticipantOut, required=True)
    attempt_ids = List(Integer(), required=True)


class InvitationIn(Schema):
    role = String(load_default="participant", validate=OneOf([r.value for r in Role]))
    email = String(load_default=None, allow_none=True, validate=Length(3, 320))
    ttl_hours = Float(load_default=72.0, validate=Range(min=0, min_inclusive=False, max=24 * 365))


class InvitationOut(Schema):
    id = Integer(required=True)
    url = String(required=True)
    role = String(required=True)
    expires_at = DateTime(required=True)


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


class TaskOut(Schema):
    id = Integer(required=True)
    slug = String(required=True)
    title = String(required=True)
    kind = String(required=True)
    content_hash = String(required=True)


class StudyListOut(Schema):
    studies = List(Nested(StudyOut), required=True)


class ParticipantListOut(Schema):
    participants = List(Nested(ParticipantOut), required=True)


class AttemptListOut(Schema):
    attempts = List(Nested(AttemptOut), required=True)


class TaskListOut(Schema):
    tasks = List(Nested(TaskOut), required=True)


class UserListOut(Schema):
    users = List(Nested(UserOut), required=True)


def _participant_out(p: Participant) -> dict[str, Any]:
    return {
        "id": p.id,
        "kind": p.kind.value,
        "display_name": p.display_name,
        "pseudonym": p.pseudonym,
        "group": p.group,
        "agent_model": p.agent_model,
        "agent_scaffold": p.agent_scaffold,
    }


def _user_out(u: User) -> dict[str, Any]:
    return {"id": u.id, "email": u.email, "name": u.name, "role": u.role.value, "active": u.active}


# --- routes --------------------------------------------------------------------------------


@bp.get("/health")
@requires(PUBLIC)
@bp.output(HealthOut)
@bp.doc(summary="Liveness and database check", security=[])
def health() -> Any:
    g.db.execute(text("SELECT 1"))
    return {"status": "ok", "database": "ok"}


@bp.get("/me")
@requires(*ANY_USER)
@bp.output(UserOut)
@bp.doc(summary="The authenticated user", responses=AUTH_ERRORS, security=BEARER)
def me() -> Any:
    return _user_out(_user())


@bp.get("/users")
@requires(Role.ADMIN)
@bp.output(UserListOut)
@bp.doc(summary="List accounts (admin)", responses=AUTH_ERRORS, security=BEARER)
def list_users() -> Any:
    return {"users": [_user_out(u) for u in g.db.scalars(select(User).order_by(User.id))]}


@bp.post("/users")
@requires(Role.ADMIN)
@bp.input(UserIn, arg_name="body")
@bp.output(UserOut, status_code=201)
@bp.doc(summary="Create an account (admin)", responses=[*AUTH_ERRORS, 409], security=BEARER)
def create_user(body: dict[str, Any]) -> Any:
    user = accounts.create_user(
        g.db, body["email"], body["name"], body["password"], Role(body["role"]), _user().id
    )
    _commit()
    return _user_out(user)


@bp.get("/studies")
@requires(*ANY_USER)
@bp.output(StudyListOut)
@bp.doc(summary="Studies the caller may see", responses=AUTH_ERRORS, security=BEARER)
def list_studies() -> Any:
    return {"studies": list(g.db.scalars(visibility.studies_query(_user())))}


@bp.post("/studies")
@requires(*STAFF)
@bp.input(StudyIn, arg_name="body")
@bp.output(StudyOut, status_code=201)
@bp.doc(summary="Create a study", responses=[*AUTH_ERRORS, 409], security=BEARER)
def create_study(body: dict[str, Any]) -> Any:
    study = studies.create_study(g.db, studies.StudySpec(**body), _user().id)
    _commit()
    return study


@bp.get("/studies/<int:study_id>")
@requires(*ANY_USER)
@bp.output(StudyOut)
@bp.doc(summary="One study", responses=AUTH_ERRORS, security=BEARER)
def get_study(study_id: int) -> Any:
    return visibility.visible_study(g.db, _user(), study_id)


@bp.patch("/studies/<int:study_id>")
@requires(*STAFF)
@bp.input(StudyPatch, arg_name="body")
@bp.output(StudyOut)
@bp.doc(summary="Change a study's status", responses=AUTH_ERRORS, security=BEARER)
def patch_study(study_id: int, body: dict[str, Any]) -> Any:
    study = studies.get_study(g.db, study_id)
    studies.set_status(g.db, study, StudyStatus(body["status"]), _user().id)
    _commit()
    return study


@bp.get("/studies/<int:study_id>/participants")
@requires(*STAFF)
@bp.output(ParticipantListOut)
@bp.doc(summary="Participants of a study", responses=AUTH_ERRORS, security=BEARER)
def list_participants(study_id: int) -> Any:
    study = studies.get_study(g.db, study_id)
    return {"participants": [_participant_out(p) for p in study.participants]}


@bp.post("/studies/<int:study_id>/agents")
@requires(*STAFF)
@bp.input(AgentIn, arg_name="body")
@bp.output(ParticipantOut, status_code=201)
@bp.doc(summary="Enrol an agent configuration", responses=AUTH_ERRORS, security=BEARER)
def add_agent(study_id: int, body: dict[str, Any]) -> Any:
    study = studies.get_study(g.db, study_id)
    participant = studies.add_agent(
        g.db,
        study,
        body["name"],
        body["scaffold"],
        body["model"],
        body["endpoint"],
        body["limits"],
        _user().id,
    )
    _commit()
    return _participant_out(participant)


@bp.post("/studies/<int:study_id>/agent-enrolments")
@requires(*STAFF)
@bp.input(AgentEnrolmentIn, arg_name="body")
@bp.output(AgentEnrolmentOut, status_code=201)
@bp.doc(
    summary="Enrol a built-in agent configuration with N runs (attempts) per task",
    responses=AUTH_ERRORS,
    security=BEARER,
)
def enrol_agent(study_id: int, body: dict[str, Any]) -> Any:
    study = studies.get_study(g.db, study_id)
    enrolment = agent_enrolment.enrol(
        g.db,
        study,
        name=body["name"],
        scaffold=body["scaffold"],
        model=body["model"],
        endpoint=body["endpoint"],
        settings=body["settings"],
        runs_per_task=body["runs_per_task"],
        actor_id=_user().id,
    )
    _commit()
    return {
        "participant": _participant_out(enrolment.participant),
        "attempt_ids": enrolment.attempt_ids,
    }


@bp.post("/studies/<int:study_id>/invitations")
@requires(*STAFF)
@bp.input(InvitationIn, arg_name="body")
@bp.output(InvitationOut, status_code=201)
@bp.doc(summary="Invite someone; the URL is shown once", responses=AUTH_ERRORS, security=BEARER)
def invite(study_id: int, body: dict[str, Any]) -> Any:
    study = studies.get_study(g.db, study_id)
    role = Role(body["role"])
    if role is Role.ADMIN and _user().role is not Role.ADMIN:
        raise Forbidden("only an admin may invite an admin")
    invitation, secret = accounts.create_invitation(
        g.db, role, timedelta(hours=body["ttl_hours"]), _user().id, study.id, body["email"]
    )
    _commit()
    return {
        "id": invitation.id,
        "url": url_for("auth.invitation", token=secret, _external=True),
        "role": invitation.role.value,
        "expires_at": invitation.expires_at,
    }


@bp.get("/attempts")
@requires(*ANY_USER)
@bp.output(AttemptListOut)
@bp.doc(summary="Attempts the caller may see", responses=AUTH_ERRORS, security=BEARER)
def list_attempts() -> Any:
    return {"attempts": list(g.db.scalars(visibility.attempts_query(_user())))}


@bp.get("/attempts/<int:attempt_id>")
@requires(*ANY_USER)
@bp.output(AttemptOut)
@bp.doc(summary="One attempt", responses=AUTH_ERRORS, security=BEARER)
def get_attempt(attempt_id: int) -> Any:
    return visibility.visible_attempt(g.db, _user(), attempt_id)


@bp.get("/tasks")
@requires(Role.COORDINATOR, Role.GRADER)
@bp.output(TaskListOut)
@bp.doc(summary="Imported tasks", responses=AUTH_ERRORS, security=BEARER)
def list_tasks() -> Any:
    return {"tasks": list(g.db.scalars(select(Task).order_by(Task.slug)))}
