"""Gradings of snapshots (judge, script, expert) with their leaf grades, for the study team; and
blind expert grading for graders (the same rules as the portal's grading area).

A grader sees a snapshot only as `expert_grading.blind` shows it: task, pseudonym, checkpoint,
never the participant's name, kind, group or model, and only their own grades.
"""

from __future__ import annotations

from typing import Any

from apiflask import Schema
from apiflask.fields import Boolean, DateTime, Dict, Float, Integer, List, Nested, String
from apiflask.validators import Length, OneOf
from flask import g
from sqlalchemy import select

from app.access import STAFF, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, blobs_present, bp, commit, context, user
from baseline.attempts.snapshots import store_for
from baseline.errors import NotFound
from baseline.grading import expert_grading
from baseline.models import Grading, Role, Snapshot

GRADERS = (Role.COORDINATOR, Role.GRADER)


class LeafGradeOut(Schema):
    leaf_path = String(required=True)
    leaf_id = String(required=True)
    score = Float(allow_none=True)
    valid = Boolean(required=True)
    explanation = String(required=True)
    error = String(allow_none=True)


class GradingOut(Schema):
    id = Integer(required=True)
    snapshot_id = Integer(required=True)
    kind = String(required=True)
    status = String(required=True)
    score = Float(allow_none=True)
    raw_score = Float(allow_none=True)
    leaves_total = Integer(required=True)
    leaves_graded = Integer(required=True)
    leaves_invalid = Integer(required=True)
    category_scores = Dict(required=True)
    cost_usd = Float(required=True)
    grader_id = Integer(allow_none=True)
    model = String(allow_none=True)
    error = String(allow_none=True)
    created_at = DateTime(required=True)
    finished_at = DateTime(allow_none=True)


class GradingDetailOut(GradingOut):
    leaves = List(Nested(LeafGradeOut), required=True)


class GradingListOut(Schema):
    gradings = List(Nested(GradingOut), required=True)


class TreeOut(Schema):
    grading_id = Integer(required=True)
    tree = Dict(required=True)


class BlindOut(Schema):
    id = Integer(required=True)
    task_title = String(required=True)
    pseudonym = String(required=True)
    checkpoint = String(required=True)
    graders = Integer(required=True)


class QueueOut(Schema):
    snapshots = List(Nested(BlindOut), required=True)


class RubricLeafOut(Schema):
    path = String(required=True)
    id = String(required=True)
    requirements = String(required=True)
    weight = Float(required=True)


class OwnGradeOut(Schema):
    path = String(required=True)
    score = Integer(required=True)
    note = String(required=True)


class GradeSheetOut(Schema):
    snapshot = Nested(BlindOut, required=True)
    leaves = List(Nested(RubricLeafOut), required=True)
    mine = List(Nested(OwnGradeOut), required=True)


class GradeIn(Schema):
    path = String(required=True, validate=Length(1, 200))
    score = Integer(required=True, validate=OneOf([0, 1]))
    note = String(load_default="", validate=Length(0, expert_grading.MAX_NOTE))


class GradesIn(Schema):
    grades = List(Nested(GradeIn), required=True, validate=Length(1, 10000))


class SavedOut(Schema):
    grading_id = Integer(required=True)
    status = String(required=True)
    score = Float(allow_none=True)
    leaves_graded = Integer(required=True)
    leaves_total = Integer(required=True)


def _out(row: Grading) -> dict[str, Any]:
    out = {name: getattr(row, name) for name in GradingOut().fields if name != "model"}
    out["kind"], out["status"] = row.kind.value, row.status.value
    out["model"] = (row.config.get("judge") or {}).get("model")
    return out


def _grading(grading_id: int) -> Grading:
    row = g.db.get(Grading, grading_id)
    if row is None:
        raise NotFound(f"no grading with id {grading_id}")
    return row


def _blind(row: Snapshot) -> dict[str, Any]:
    blind = expert_grading.blind(row, expert_grading.grader_count(g.db, row.id))
    return {
        "id": blind.id,
        "task_title": blind.task_title,
        "pseudonym": blind.pseudonym,
        "checkpoint": blind.checkpoint,
        "graders": blind.graders,
    }


@bp.get("/snapshots/<int:snapshot_id>/gradings")
@requires(*STAFF)
@bp.output(GradingListOut)
@bp.doc(
    summary="Gradings of a snapshot (judge, script, expert)",
    responses=[*AUTH_ERRORS, 404],
    security=BEARER,
)
def list_gradings(snapshot_id: int) -> Any:
    if g.db.get(Snapshot, snapshot_id) is None:
        raise NotFound(f"no snapshot with id {snapshot_id}")
    rows = g.db.scalars(
        select(Grading).where(Grading.snapshot_id == snapshot_id).order_by(Grading.id)
    )
    return {"gradings": [_out(r) for r in rows]}


@bp.get("/gradings/<int:grading_id>")
@requires(*STAFF)
@bp.output(GradingDetailOut)
@bp.doc(summary="One grading with its leaf grades", responses=[*AUTH_ERRORS, 404], security=BEARER)
def get_grading(grading_id: int) -> Any:
    row = _grading(grading_id)
    leaves = sorted(row.leaves, key=lambda leaf: leaf.leaf_path)
    return {**_out(row), "leaves": leaves}


@bp.get("/gradings/<int:grading_id>/tree")
@requires(*STAFF)
@bp.output(TreeOut)
@bp.doc(
    summary="The grading as a PaperBench graded rubric tree",
    responses=[*AUTH_ERRORS, 404, 409, 422],
    security=BEARER,
)
def grading_tree(grading_id: int) -> Any:
    row = _grading(grading_id)
    with blobs_present(f"grading {row.id}"):
        tree = expert_grading.export_tree(g.db, store_for(context()), row.id)
    return {"grading_id": row.id, "tree": tree}


@bp.get("/expert-grading/queue")
@requires(*GRADERS)
@bp.output(QueueOut)
@bp.doc(
    summary="Snapshots to grade, blind, those with the fewest graders first",
    responses=AUTH_ERRORS,
    security=BEARER,
)
def grading_queue() -> Any:
    return {"snapshots": [vars(b) for b in expert_grading.gradable(g.db)]}


@bp.get("/expert-grading/snapshots/<int:snapshot_id>")
@requires(*GRADERS)
@bp.output(GradeSheetOut)
@bp.doc(
    summary="The grade sheet of a snapshot: rubric leaves and the caller's own grades",
    responses=[*AUTH_ERRORS, 404, 409, 422],
    security=BEARER,
)
def grade_sheet(snapshot_id: int) -> Any:
    row = expert_grading.snapshot(g.db, snapshot_id)
    with blobs_present(f"snapshot {row.id}"):
        _rubric, leaves = expert_grading.leaves(g.db, store_for(context()), row)
    mine = expert_grading.own_grades(g.db, row, user())
    return {
        "snapshot": _blind(row),
        "leaves": [
            {
                "path": leaf.path,
                "id": leaf.node.id,
                "requirements": leaf.node.requirements,
                "weight": leaf.node.weight,
            }
            for leaf in leaves
        ],
        "mine": [
            {"path": path, "score": int(grade.score or 0), "note": grade.explanation}
            for path, grade in sorted(mine.items())
            if grade.score is not None
        ],
    }


@bp.put("/expert-grading/snapshots/<int:snapshot_id>/grades")
@requires(*GRADERS)
@bp.input(GradesIn, arg_name="body")
@bp.output(SavedOut)
@bp.doc(
    summary="Record the caller's 0/1 grades for some leaves (re-grading overwrites)",
    responses=[*AUTH_ERRORS, 404, 409, 422],
    security=BEARER,
)
def save_grades(snapshot_id: int, body: dict[str, Any]) -> Any:
    row = expert_grading.snapshot(g.db, snapshot_id)
    grades = {item["path"]: (item["score"], item["note"].strip()) for item in body["grades"]}
    with blobs_present(f"snapshot {row.id}"):
        grading = expert_grading.save_grades(g.db, store_for(context()), row, user(), grades)
    commit()
    return {
        "grading_id": grading.id,
        "status": grading.status.value,
        "score": grading.score,
        "leaves_graded": grading.leaves_graded,
        "leaves_total": grading.leaves_total,
    }
