"""REST API under /api/v1 (token authentication, JSON errors, OpenAPI 3 document)."""

from __future__ import annotations

from typing import Any

from apiflask import APIBlueprint, Schema
from apiflask.fields import String

from app.access import PUBLIC, requires

bp = APIBlueprint("api", __name__, url_prefix="/api/v1")
CSRF_EXEMPT = True


class HealthOut(Schema):
    status = String(required=True)
    database = String(required=True)


@bp.get("/health")
@bp.output(HealthOut)
@bp.doc(summary="Liveness and database check", security=[])
@requires(PUBLIC)
def health() -> Any:
    from flask import g
    from sqlalchemy import text

    g.db.execute(text("SELECT 1"))
    return {"status": "ok", "database": "ok"}
