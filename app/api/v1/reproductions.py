"""Reproductions of a snapshot (`bash reproduce.sh` in a fresh workspace) and their logs.

Staff read all; a grader only those of snapshots in the blind grading queue.
"""

from __future__ import annotations

from typing import Any

from apiflask import Schema
from apiflask.fields import Boolean, DateTime, Float, Integer, List, Nested, String
from apiflask.schemas import FileSchema
from flask import g
from sqlalchemy import select

from app.access import STAFF, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, blobs_present, bp, context, send_bytes
from app.api.v1.snapshots import readable_snapshot
from baseline.attempts.snapshots import store_for
from baseline.errors import NotFound
from baseline.grading import reproductions
from baseline.models import Reproduction, Role

READERS = (Role.GRADER, *STAFF)


class ReproductionOut(Schema):
    id = Integer(required=True)
    snapshot_id = Integer(required=True)
    status = String(required=True)
    exit_code = Integer(allow_none=True)
    duration_s = Float(allow_none=True)
    timed_out = Boolean(required=True)
    failure_class = String(allow_none=True)
    salvage_used = Boolean(required=True)
    error = String(allow_none=True)
    started_at = DateTime(allow_none=True)
    finished_at = DateTime(allow_none=True)
    has_log = Boolean(required=True)


class ReproductionListOut(Schema):
    reproductions = List(Nested(ReproductionOut), required=True)


def _out(row: Reproduction) -> dict[str, Any]:
    live = reproductions.current_live_log(context().settings, row)
    return {
        **{name: getattr(row, name) for name in ReproductionOut().fields if name != "has_log"},
        "status": row.status.value,
        "has_log": bool(row.log_sha256) or (live is not None and live.exists()),
    }


def _reproduction(reproduction_id: int) -> Reproduction:
    row = g.db.get(Reproduction, reproduction_id)
    if row is None:
        raise NotFound(f"no reproduction with id {reproduction_id}")
    readable_snapshot(row.snapshot_id)
    return row


@bp.get("/snapshots/<int:snapshot_id>/reproductions")
@requires(*READERS)
@bp.output(ReproductionListOut)
@bp.doc(summary="Reproductions of a snapshot", responses=[*AUTH_ERRORS, 404], security=BEARER)
def list_reproductions(snapshot_id: int) -> Any:
    snapshot = readable_snapshot(snapshot_id)
    rows = g.db.scalars(
        select(Reproduction)
        .where(Reproduction.snapshot_id == snapshot.id)
        .order_by(Reproduction.id)
    )
    return {"reproductions": [_out(r) for r in rows]}


@bp.get("/reproductions/<int:reproduction_id>")
@requires(*READERS)
@bp.output(ReproductionOut)
@bp.doc(summary="One reproduction", responses=[*AUTH_ERRORS, 404], security=BEARER)
def get_reproduction(reproduction_id: int) -> Any:
    return _out(_reproduction(reproduction_id))


@bp.get("/reproductions/<int:reproduction_id>/log")
@requires(*READERS)
@bp.output(FileSchema(), content_type="text/plain")
@bp.doc(
    summary="The reproduction's log (while it runs: the log so far)",
    responses=[*AUTH_ERRORS, 404, 409],
    security=BEARER,
)
def reproduction_log(reproduction_id: int) -> Any:
    row = _reproduction(reproduction_id)
    if row.log_sha256:
        with blobs_present(f"reproduction {row.id} log"):
            data = store_for(context()).get_bytes(row.log_sha256)
    else:
        live = reproductions.current_live_log(context().settings, row)
        if live is None or not live.exists():
            raise NotFound(f"reproduction {row.id} has no log yet")
        data = live.read_bytes()
    return send_bytes(data, "text/plain; charset=utf-8", f"reproduction-{row.id}.log")
