"""The study monitor (`baseline.monitor`) for coordinators and admins: the live board, the
study's monitor settings, its alerts and their deliveries, and acknowledging an alert.

The board answers with an ETag; a client that sends it back in ``If-None-Match`` gets 304 while
nothing but the passing of time changed (it extrapolates working time itself), which is what
keeps polling every few seconds cheap (`benchmarks/bench_monitor.py`).
"""

from __future__ import annotations

from typing import Any

from apiflask import Schema, abort
from apiflask.fields import Boolean, DateTime, Dict, Float, Integer, List, Nested, String
from apiflask.validators import Length, Range
from flask import Response, g, request
from sqlalchemy import select

from app.access import STAFF, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, commit, context, user
from baseline.errors import NotFound
from baseline.models import Alert, AlertDelivery, User
from baseline.monitor import alerts, board, hub_activity, settings
from baseline.studies import studies


class BoardOut(Schema):
    study_id = Integer(required=True)
    study = String(required=True)
    at = DateTime(required=True)
    attempts = List(Dict(), required=True)
    hosts = List(Dict(), required=True)
    queue = Dict(required=True)
    spend = Dict(required=True)
    alerts = List(Dict(), required=True)


class ThresholdsIn(Schema):
    workspace_dead = Boolean()
    idle_minutes = Float(allow_none=True, validate=Range(min=0, min_inclusive=False, max=1e6))
    snapshot_late_minutes = Float(allow_none=True, validate=Range(min=0, max=1e6))
    failure_rate = Float(allow_none=True, validate=Range(min=0, max=1))
    failure_min_count = Integer(validate=Range(min=1, max=10_000))
    queue_minutes = Float(allow_none=True, validate=Range(min=0, min_inclusive=False, max=1e6))
    host_down = Boolean()
    spend_share = Float(allow_none=True, validate=Range(min=0, min_inclusive=False, max=100))


class SettingsIn(Schema):
    budget_usd = Float(allow_none=True, validate=Range(min=0, max=1e9))
    thresholds = Nested(ThresholdsIn)
    email_to = List(String(validate=Length(3, 320)), validate=Length(0, 20))
    webhook_url = String(allow_none=True, validate=Length(0, 500))


class SettingsOut(Schema):
    budget_usd = Float(allow_none=True)
    thresholds = Dict(required=True)
    email_to = List(String(), required=True)
    webhook_url = String(allow_none=True)
    webhook_secret = String(
        allow_none=True,
        metadata={"description": "the HMAC-SHA256 key the webhook's requests are signed with"},
    )


class DeliveryOut(Schema):
    channel = String(required=True)
    event = String(required=True)
    target = String(required=True)
    tries = Integer(required=True)
    ok = Boolean(required=True)
    error = String(allow_none=True)
    at = DateTime(required=True)


class AlertOut(Schema):
    id = Integer(required=True)
    study_id = Integer(required=True)
    rule = String(required=True)
    subject = String(required=True)
    message = String(required=True)
    fired_at = DateTime(required=True)
    cleared_at = DateTime(allow_none=True)
    acknowledged_at = DateTime(allow_none=True)
    acknowledged_by = String(allow_none=True)
    deliveries = List(Nested(DeliveryOut), required=True)


def board_response(study_id: int) -> Response:
    """The board as JSON with its version as ETag, or 304 (without building the board) when
    the client holds the current version."""
    study = studies.get_study(g.db, study_id)
    hub = hub_activity.load(context().settings)
    tag = board.version(g.db, study.id, hub=hub)
    if tag in request.if_none_match:
        response = Response(status=304)
    else:
        found = board.study_board(g.db, study, hub=hub)
        response = Response(board.board_json(found), mimetype="application/json")
    response.set_etag(tag)
    response.headers["Cache-Control"] = "no-cache"
    return response


@bp.get("/studies/<int:study_id>/monitor")
@requires(*STAFF)
@bp.output(BoardOut)
@bp.doc(
    summary="The study's live monitor: attempts, hosts, scoring queue, spend, alerts "
    "(ETag; 304 with If-None-Match while unchanged)",
    responses=[*AUTH_ERRORS, 304, 404],
    security=BEARER,
)
def get_board(study_id: int) -> Any:
    return board_response(study_id)


def _settings_out(study_id: int) -> tuple[dict[str, Any], int, dict[str, str]]:
    """The settings, with their version as ETag (to send back in If-Match with a change)."""
    config = settings.load(g.db, study_id)
    body = {**config.model_dump(), "webhook_secret": settings.webhook_secret(g.db, study_id)}
    return body, 200, {"ETag": f'"{settings.version(config)}"', "Cache-Control": "no-cache"}


@bp.get("/studies/<int:study_id>/monitor/settings")
@requires(*STAFF)
@bp.output(SettingsOut)
@bp.doc(
    summary="The study's budget, alert thresholds and alert recipients (ETag: their version)",
    responses=[*AUTH_ERRORS, 404],
    security=BEARER,
)
def get_settings(study_id: int) -> Any:
    studies.get_study(g.db, study_id)
    return _settings_out(study_id)


@bp.put("/studies/<int:study_id>/monitor/settings")
@requires(*STAFF)
@bp.input(SettingsIn, arg_name="body")
@bp.output(SettingsOut)
@bp.doc(
    summary="Set the study's budget, alert thresholds and recipients (fields left out keep "
    "their defaults); with If-Match, only if they are still the version read",
    responses=[*AUTH_ERRORS, 404, 412, 422],
    security=BEARER,
)
def put_settings(study_id: int, body: dict[str, Any]) -> Any:
    study = studies.get_study(g.db, study_id)
    if request.if_match:
        now = settings.version(settings.load(g.db, study_id))
        if not request.if_match.contains(now):
            abort(
                412,
                "the monitor settings changed since you read them (If-Match); nothing was "
                f'saved: GET them again (ETag "{now}"), apply your change and PUT it',
            )
    settings.save(g.db, study, settings.parse(body), user().id)
    commit()
    return _settings_out(study_id)


def _alert_out(alert: Alert) -> dict[str, Any]:
    by = g.db.get(User, alert.acknowledged_by_id) if alert.acknowledged_by_id else None
    deliveries = g.db.scalars(
        select(AlertDelivery).where(AlertDelivery.alert_id == alert.id).order_by(AlertDelivery.id)
    ).all()
    return {
        "id": alert.id,
        "study_id": alert.study_id,
        "rule": alert.rule.value,
        "subject": alert.subject,
        "message": alert.message,
        "fired_at": alert.fired_at,
        "cleared_at": alert.cleared_at,
        "acknowledged_at": alert.acknowledged_at,
        "acknowledged_by": by.name if by else None,
        "deliveries": deliveries,
    }


@bp.get("/studies/<int:study_id>/alerts/<int:alert_id>")
@requires(*STAFF)
@bp.output(AlertOut)
@bp.doc(summary="One alert with its deliveries", responses=[*AUTH_ERRORS, 404], security=BEARER)
def get_alert(study_id: int, alert_id: int) -> Any:
    alert = g.db.get(Alert, alert_id)
    if alert is None or alert.study_id != study_id:
        raise NotFound(f"study {study_id} has no alert {alert_id}")
    return _alert_out(alert)


@bp.post("/studies/<int:study_id>/alerts/<int:alert_id>/acknowledge")
@requires(*STAFF)
@bp.output(AlertOut)
@bp.doc(
    summary="Acknowledge an alert (recorded with who and when)",
    responses=[*AUTH_ERRORS, 404, 409],
    security=BEARER,
)
def acknowledge_alert(study_id: int, alert_id: int) -> Any:
    alert = alerts.acknowledge(g.db, study_id, alert_id, user())
    commit()
    return _alert_out(alert)
