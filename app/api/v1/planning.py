"""The study planner: the tasks and runs that detect a gap, and their cost (analysis.planner)."""

from __future__ import annotations

from typing import Any

from apiflask import Schema
from apiflask.fields import Boolean, Dict, Float, Integer, List, Nested, String
from apiflask.validators import Length, OneOf, Range
from flask import g

from app.access import requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, user
from baseline.errors import InvalidInput
from baseline.models import Role
from baseline.people import visibility


class CheckpointIn(Schema):
    hours = Float(required=True, validate=Range(min=0, min_inclusive=False, max=10_000))
    mean_a = Float(required=True)
    mean_b = Float(required=True)


class CostsIn(Schema):
    human_hourly_usd = Float(validate=Range(min=0, max=1e6))
    gpu_hourly_usd = Float(validate=Range(min=0, max=1e6))
    gpus_per_workspace = Integer(validate=Range(min=0, max=64))
    judge_usd_per_snapshot = Float(validate=Range(min=0, max=1e6))
    agent_usd_per_attempt = Float(validate=Range(min=0, max=1e6))


class PlanIn(Schema):
    pilot_study_id = Integer(
        validate=Range(min=1),
        metadata={
            "description": "measure the guesses on this study (then `checkpoints` only picks hours)"
        },
    )
    group_a = String(load_default="human", validate=Length(1, 200))
    group_b = String(load_default="agent", validate=Length(1, 200))
    a_is_human = Boolean(load_default=True)
    checkpoints = List(Nested(CheckpointIn), validate=Length(0, 8), load_default=[])
    shape = String(validate=OneOf(["bounded", "positive"]))
    task_sd = Float(validate=Range(min=0, max=5))
    attempt_sd = Float(validate=Range(min=0, max=5))
    zero_share_a = Float(validate=Range(min=0, max=1, max_inclusive=False))
    zero_share_b = Float(validate=Range(min=0, max=1, max_inclusive=False))
    attempts_a = Integer(validate=Range(min=1, max=20))
    attempts_b = Integer(validate=Range(min=1, max=20))
    tasks_per_human = Integer(validate=Range(min=1, max=100))
    limit_hours = Float(validate=Range(min=0, min_inclusive=False, max=10_000))
    power = Float(validate=Range(min=0, max=1))
    level = Float(validate=Range(min=0, max=1, min_inclusive=False, max_inclusive=False))
    studies = Integer(validate=Range(min=200, max=5000))
    max_tasks = Integer(validate=Range(min=3, max=100))
    costs = Nested(CostsIn)


class PlanOut(Schema):
    plan = Dict(required=True)


@bp.post("/plan")
@requires(Role.COORDINATOR, Role.ANALYST)
@bp.input(PlanIn, arg_name="body")
@bp.output(PlanOut)
@bp.doc(
    summary="Plan a study: the tasks needed to detect a gap at each checkpoint, power curves "
    "and the cost, from stated guesses or a pilot study",
    responses=[*AUTH_ERRORS, 404, 422],
    security=BEARER,
)
def plan_study(body: dict[str, Any]) -> Any:
    from analysis import load_study, planner

    pilot = body.pop("pilot_study_id", None)
    data = None
    if pilot is not None:
        study = visibility.visible_study(g.db, user(), pilot)
        data = load_study(study.id, session=g.db)
    try:
        spec = planner.build_spec(
            data,
            body.pop("group_a"),
            body.pop("group_b"),
            body.pop("checkpoints", []),
            body,
            body.pop("costs", None) or {},
        )
        result = planner.plan(spec, max_scores=planner.PORTAL_MAX_SCORES)
    except planner.PlanError as exc:
        raise InvalidInput(str(exc)) from exc
    return {"plan": result.model_dump(mode="json")}
