"""Tasks: the imported task catalogue."""

from __future__ import annotations

from typing import Any

from apiflask import Schema
from apiflask.fields import Integer, List, Nested, String
from flask import g
from sqlalchemy import select

from app.access import requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp
from baseline.models import Role, Task


class TaskOut(Schema):
    id = Integer(required=True)
    slug = String(required=True)
    title = String(required=True)
    kind = String(required=True)
    content_hash = String(required=True)


class TaskListOut(Schema):
    tasks = List(Nested(TaskOut), required=True)


@bp.get("/tasks")
@requires(Role.COORDINATOR, Role.GRADER)
@bp.output(TaskListOut)
@bp.doc(summary="Imported tasks", responses=AUTH_ERRORS, security=BEARER)
def list_tasks() -> Any:
    return {"tasks": list(g.db.scalars(select(Task).order_by(Task.slug)))}
