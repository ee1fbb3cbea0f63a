"""Attempts: list and read (object-level visibility as in the portal)."""

from __future__ import annotations

from typing import Any

from apiflask import Schema
from apiflask.fields import DateTime, Float, Integer, List, Nested, String
from flask import g

from app.access import ANY_USER, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, user
from baseline import visibility


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


class AttemptListOut(Schema):
    attempts = List(Nested(AttemptOut), required=True)


@bp.get("/attempts")
@requires(*ANY_USER)
@bp.output(AttemptListOut)
@bp.doc(summary="Attempts the caller may see", responses=AUTH_ERRORS, security=BEARER)
def list_attempts() -> Any:
    return {"attempts": list(g.db.scalars(visibility.attempts_query(user())))}


@bp.get("/attempts/<int:attempt_id>")
@requires(*ANY_USER)
@bp.output(AttemptOut)
@bp.doc(summary="One attempt", responses=AUTH_ERRORS, security=BEARER)
def get_attempt(attempt_id: int) -> Any:
    return visibility.visible_attempt(g.db, user(), attempt_id)
