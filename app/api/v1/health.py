"""Liveness and the caller's own account."""

from __future__ import annotations

from typing import Any

from apiflask import Schema
from apiflask.fields import String
from flask import g
from sqlalchemy import text

from app.access import ANY_USER, PUBLIC, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, user
from app.api.v1.users import UserOut, user_out


class HealthOut(Schema):
    status = String(required=True)
    database = String(required=True)


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
    return user_out(user())
