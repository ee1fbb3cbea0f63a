"""Accounts (admin only)."""

from __future__ import annotations

from typing import Any

from apiflask import Schema
from apiflask.fields import Boolean, Integer, List, Nested, String
from apiflask.validators import Length, OneOf
from flask import g
from sqlalchemy import select

from app.access import requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, commit, user
from baseline.models import Role, User
from baseline.people import accounts


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


class UserListOut(Schema):
    users = List(Nested(UserOut), required=True)


def user_out(u: User) -> dict[str, Any]:
    return {"id": u.id, "email": u.email, "name": u.name, "role": u.role.value, "active": u.active}


@bp.get("/users")
@requires(Role.ADMIN)
@bp.output(UserListOut)
@bp.doc(summary="List accounts (admin)", responses=AUTH_ERRORS, security=BEARER)
def list_users() -> Any:
    return {"users": [user_out(u) for u in g.db.scalars(select(User).order_by(User.id))]}


@bp.post("/users")
@requires(Role.ADMIN)
@bp.input(UserIn, arg_name="body")
@bp.output(UserOut, status_code=201)
@bp.doc(summary="Create an account (admin)", responses=[*AUTH_ERRORS, 409], security=BEARER)
def create_user(body: dict[str, Any]) -> Any:
    created = accounts.create_user(
        g.db, body["email"], body["name"], body["password"], Role(body["role"]), user().id
    )
    commit()
    return user_out(created)
