"""Studies: list, create, read, change status."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from apiflask import Schema, abort
from apiflask.fields import DateTime, Float, Integer, List, Method, Nested, String
from apiflask.validators import Length, OneOf, Range
from flask import g, request
from marshmallow import ValidationError, validates_schema

from app.access import ANY_USER, STAFF, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, commit, user
from baseline.grading import expbench_grading
from baseline.jobs import orchestration
from baseline.models import EgressPolicy, Study, StudyStatus
from baseline.people import visibility
from baseline.studies import studies


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
    snapshot_policy = String(required=True)
    reproduction_timeout_minutes = Float(required=True)
    human_hourly_rate_usd = Float(required=True)
    created_at = DateTime(required=True)
    judge = Method("judge_of", metadata={"description": "The study's judge (null: none set)"})

    def judge_of(self, study: Study) -> dict[str, Any] | None:
        """The judge new snapshots are graded with, and the EXP-Bench rules it grades under:
        set by `baseline grading set-judge` or `baseline rescore` (its endpoint's address is
        left out)."""
        judge = orchestration.study_judge(study)
        if judge is None:
            return None
        return {
            "model": judge.config.model,
            "config_hash": judge.config.config_hash(),
            "code_dev": judge.code_dev,
            "expbench_all_passed": expbench_grading.study_policy(study).model_dump(mode="json"),
            "expbench_execution_limit_s": expbench_grading.study_execution_limit(study),
        }


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
    # What a snapshot keeps: "paperbench" keeps caches and environments, as PaperBench's tarball.
    snapshot_policy = String(load_default="baseline", validate=OneOf(studies.SNAPSHOT_POLICIES))
    reproduction_timeout_minutes = Float(
        load_default=720.0, validate=Range(min=0, min_inclusive=False, max=1e6)
    )


_POSITIVE = Range(min=0, min_inclusive=False, max=1e6)


class StudyPatch(Schema):
    """A study's status and settings, each optional; settings are changed as the portal's edit
    page changes them (`studies.edit_study`: comparability settings only before any attempt
    has started, every change audited)."""

    status = String(validate=OneOf([s.value for s in StudyStatus]))
    name = String(validate=Length(1, 200))
    description = String(validate=Length(0, 10000))
    hardware_profile = String(validate=Length(1, 64))
    checkpoint_hours = List(Float(validate=_POSITIVE), validate=Length(0, 100))
    snapshot_interval_minutes = Float(allow_none=True, validate=_POSITIVE)
    working_time_limit_hours = Float(validate=_POSITIVE)
    wall_clock_limit_hours = Float(allow_none=True, validate=_POSITIVE)
    time_scale = Float(validate=Range(min=0, min_inclusive=False, max=1e9))
    egress_policy = String(validate=OneOf([p.value for p in EgressPolicy]))
    snapshot_policy = String(validate=OneOf(studies.SNAPSHOT_POLICIES))
    idle_pause_minutes = Float(allow_none=True, validate=_POSITIVE)
    reproduction_timeout_minutes = Float(validate=_POSITIVE)
    human_hourly_rate_usd = Float(validate=Range(min=0, max=1e6))

    @validates_schema
    def _something(self, data: dict[str, Any], **_: Any) -> None:
        if not data:
            raise ValidationError("give the status or at least one setting to change")


class StudyListOut(Schema):
    studies = List(Nested(StudyOut), required=True)


@bp.get("/studies")
@requires(*ANY_USER)
@bp.output(StudyListOut)
@bp.doc(summary="Studies the caller may see", responses=AUTH_ERRORS, security=BEARER)
def list_studies() -> Any:
    return {"studies": list(g.db.scalars(visibility.studies_query(user())))}


@bp.post("/studies")
@requires(*STAFF)
@bp.input(StudyIn, arg_name="body")
@bp.output(StudyOut, status_code=201)
@bp.doc(summary="Create a study", responses=[*AUTH_ERRORS, 409], security=BEARER)
def create_study(body: dict[str, Any]) -> Any:
    study = studies.create_study(g.db, studies.StudySpec(**body), user().id)
    commit()
    return study


def _version(study: Study) -> str:
    """The version of the study as the API shows it (its ETag): a client sends it back in
    If-Match with a change, so that one made from a stale read (two clients setting the status,
    the limit...) is refused rather than undoing the other's unseen."""
    shown = StudyOut().dump(study)
    return hashlib.sha256(json.dumps(shown, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _versioned(study: Study) -> tuple[Study, int, dict[str, str]]:
    return study, 200, {"ETag": f'"{_version(study)}"', "Cache-Control": "no-cache"}


@bp.get("/studies/<int:study_id>")
@requires(*ANY_USER)
@bp.output(StudyOut)
@bp.doc(summary="One study (ETag: its version)", responses=AUTH_ERRORS, security=BEARER)
def get_study(study_id: int) -> Any:
    return _versioned(visibility.visible_study(g.db, user(), study_id))


@bp.patch("/studies/<int:study_id>")
@requires(*STAFF)
@bp.input(StudyPatch, arg_name="body")
@bp.output(StudyOut)
@bp.doc(
    summary="Change a study's status or settings (with If-Match: only if it is still the "
    "version read)",
    description="Checkpoints, limits, hardware, network, snapshot and idle settings are refused "
    "(409) once an attempt of the study has started; name, description and hourly rate any time.",
    responses=[*AUTH_ERRORS, 404, 409, 412],
    security=BEARER,
)
def patch_study(study_id: int, body: dict[str, Any]) -> Any:
    study = studies.get_study(g.db, study_id)
    if request.if_match:
        now = _version(study)
        if not request.if_match.contains(now):
            abort(
                412,
                "the study changed since you read it (If-Match); nothing was changed: GET it "
                f'again (ETag "{now}"), apply your change and send it',
            )
    settings = {k: v for k, v in body.items() if k != "status"}
    if settings:
        studies.edit_study(g.db, study, settings, user().id)
    if "status" in body:
        studies.set_status(g.db, study, StudyStatus(body["status"]), user().id)
    commit()
    return _versioned(study)
