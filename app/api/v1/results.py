"""Results: an attempt's scores over working time, and a study's tidy table for analysts.

The tidy table is the one `analysis.load_study` builds (one row per attempt x checkpoint), the
same the analyst dashboard and `baseline export` use; `analysis.remote` reads it back from here
into the same `StudyData` (Parquet keeps the column types).
"""

from __future__ import annotations

import io
from typing import Any

from apiflask import Schema
from apiflask.fields import DateTime, Dict, Float, Integer, List, Nested, String
from apiflask.schemas import FileSchema
from flask import g
from sqlalchemy import select

from app.access import STAFF, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, send_bytes, user
from baseline.attempts import snapshots
from baseline.grading import script_scoring
from baseline.models import Grading, Role
from baseline.people import visibility

ANALYSTS = (Role.COORDINATOR, Role.ANALYST)


class IntermediateOut(Schema):
    working_hours = Float(required=True)
    raw_score = Float(allow_none=True)
    normalised_score = Float(allow_none=True)
    floor_reason = String(
        allow_none=True,
        metadata={
            "description": "set when the score is the task's floor: the submission failed "
            "the scoring (e.g. no_score); the error says why"
        },
    )
    error = String(allow_none=True)
    status = String(
        allow_none=True,
        metadata={
            "description": "running while it is scored (no score yet, no error); succeeded "
            "(a score, the floor included) or failed (no score: the error says why, an "
            "interrupted scoring included); null for a row archived before it was recorded"
        },
    )
    created_at = DateTime(required=True)


class GradingScoreOut(Schema):
    grading_id = Integer(required=True)
    kind = String(required=True)
    status = String(required=True)
    score = Float(allow_none=True)
    floor_reason = String(
        allow_none=True,
        metadata={
            "description": "set when the score is the task's floor: the submission failed "
            "the scoring (e.g. no_score)"
        },
    )


class SnapshotScoresOut(Schema):
    snapshot_id = Integer(required=True)
    kind = String(required=True)
    working_hours = Float(required=True)
    gradings = List(Nested(GradingScoreOut), required=True)


class ScoresOut(Schema):
    attempt_id = Integer(required=True)
    snapshots = List(Nested(SnapshotScoresOut), required=True)
    intermediate = List(Nested(IntermediateOut), required=True)


class AgreementOut(Schema):
    rows = List(Dict(), required=True)


def _study_data(study_id: int) -> Any:
    from analysis import load_study

    study = visibility.visible_study(g.db, user(), study_id)
    return load_study(study.id, session=g.db)


@bp.get("/attempts/<int:attempt_id>/scores")
@requires(*STAFF)
@bp.output(ScoresOut)
@bp.doc(
    summary="Scores over working time: every grading of every snapshot, and intermediate "
    "scores of a scored task",
    responses=[*AUTH_ERRORS, 404],
    security=BEARER,
)
def attempt_scores(attempt_id: int) -> Any:
    attempt = visibility.visible_attempt(g.db, user(), attempt_id)
    rows = []
    for snap in snapshots.list_snapshots(g.db, attempt.id):
        gradings = g.db.scalars(
            select(Grading).where(Grading.snapshot_id == snap.id).order_by(Grading.id)
        )
        rows.append(
            {
                "snapshot_id": snap.id,
                "kind": snap.kind.value,
                "working_hours": snap.taken_working_s / 3600.0,
                "gradings": [
                    {
                        "grading_id": gr.id,
                        "kind": gr.kind.value,
                        "status": gr.status.value,
                        "score": gr.score,
                        "floor_reason": gr.floor_reason,
                    }
                    for gr in gradings
                ],
            }
        )
    logs = [
        {
            "working_hours": log.working_s / 3600.0,
            "raw_score": log.raw_score,
            "normalised_score": log.normalised_score,
            "floor_reason": log.floor_reason,
            "error": log.error,
            "status": None if log.status is None else log.status.value,
            "created_at": log.created_at,
        }
        for log in script_scoring.score_logs(g.db, attempt.id)
    ]
    return {"attempt_id": attempt.id, "snapshots": rows, "intermediate": logs}


@bp.get("/studies/<int:study_id>/table.csv")
@requires(*ANALYSTS)
@bp.output(FileSchema(), content_type="text/csv")
@bp.doc(
    summary="The study's tidy table (one row per attempt and checkpoint) as CSV",
    responses=[*AUTH_ERRORS, 404],
    security=BEARER,
)
def table_csv(study_id: int) -> Any:
    from analysis import report  # pandas and plotly load only when a table is asked for

    data = _study_data(study_id)
    return send_bytes(
        report.csv_text(data.table).encode(), "text/csv", f"study-{data.study_id}-table.csv"
    )


@bp.get("/studies/<int:study_id>/table.parquet")
@requires(*ANALYSTS)
@bp.output(FileSchema(), content_type="application/vnd.apache.parquet")
@bp.doc(
    summary="The study's tidy table as Parquet (column types kept)",
    responses=[*AUTH_ERRORS, 404],
    security=BEARER,
)
def table_parquet(study_id: int) -> Any:
    data = _study_data(study_id)
    buffer = io.BytesIO()
    data.table.to_parquet(buffer, index=False)
    return send_bytes(
        buffer.getvalue(),
        "application/vnd.apache.parquet",
        f"study-{data.study_id}-table.parquet",
    )


@bp.get("/studies/<int:study_id>/agreement")
@requires(*ANALYSTS)
@bp.output(AgreementOut)
@bp.doc(
    summary="Judge-versus-expert agreement per graded snapshot (the analyst's agreement table)",
    responses=[*AUTH_ERRORS, 404],
    security=BEARER,
)
def agreement(study_id: int) -> Any:
    data = _study_data(study_id)
    frame = data.agreement
    return {"rows": frame.astype(object).where(frame.notna(), None).to_dict("records")}
