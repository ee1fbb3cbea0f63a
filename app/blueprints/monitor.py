"""The study monitor page (coordinators and admins): every attempt, host and queue of a study,
updated live without a reload, with the study's alerts, budget and alert thresholds.

The page carries the board as JSON; its script (`monitor.js`, served from here because the
portal's Content-Security-Policy allows no inline script) polls `board` with the ETag it holds
and redraws only when the answer is not 304, filtering and sorting in the browser.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Blueprint, Response, flash, g, redirect, render_template, request, url_for

from app.access import STAFF, current_user, requires
from app.api.v1.monitor import board_response
from app.factory import get_context
from baseline.errors import Conflict, InvalidInput
from baseline.monitor import alerts, board, hub_activity, settings
from baseline.studies import studies

bp = Blueprint("monitor", __name__, url_prefix="/studies")

SCRIPT = Path(__file__).resolve().parent.parent / "templates" / "monitor" / "monitor.js"
POLL_MS = 3000


@bp.route("/monitor.js")
@requires(*STAFF)
def script() -> Response:
    response = Response(SCRIPT.read_text(), mimetype="application/javascript")
    response.headers["Cache-Control"] = "no-cache"
    return response


@bp.route("/<int:study_id>/monitor")
@requires(*STAFF)
def page(study_id: int) -> Any:
    return _page(study_id)


def _page(study_id: int, status: int = 200) -> Any:
    study = studies.get_study(g.db, study_id)
    hub = hub_activity.load(get_context().settings)
    tag = board.version(g.db, study.id, hub=hub)
    found = board.study_board(g.db, study, hub=hub)
    config = settings.load(g.db, study.id)
    return render_template(
        "monitor/index.html",
        study=study,
        board=board.board_json(found),
        etag=tag,
        config=config,
        webhook_secret=settings.webhook_secret(g.db, study.id),
        poll_ms=POLL_MS,
    ), status


@bp.route("/<int:study_id>/monitor/board")
@requires(*STAFF)
def board_json(study_id: int) -> Response:
    return board_response(study_id)


def _optional_float(name: str) -> float | None:
    raw = request.form.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError as exc:
        raise InvalidInput(f"{name.replace('_', ' ')}: not a number: {raw!r}") from exc


def _form_config() -> settings.MonitorConfig:
    """The settings form as a MonitorConfig; an empty threshold turns its rule off."""
    thresholds = {
        name: _optional_float(name)
        for name in (
            "idle_minutes",
            "snapshot_late_minutes",
            "failure_rate",
            "queue_minutes",
            "spend_share",
        )
    }
    count = _optional_float("failure_min_count")
    return settings.parse(
        {
            "budget_usd": _optional_float("budget_usd"),
            "thresholds": {
                **thresholds,
                "failure_min_count": int(count) if count is not None else 4,
                "workspace_dead": "workspace_dead" in request.form,
                "host_down": "host_down" in request.form,
            },
            "email_to": request.form.get("email_to", "").replace(";", ",").split(","),
            "webhook_url": request.form.get("webhook_url", "").strip() or None,
        }
    )


@bp.route("/<int:study_id>/monitor/settings", methods=["POST"])
@requires(*STAFF)
def save_settings(study_id: int) -> Any:
    study = studies.get_study(g.db, study_id)
    user = current_user()
    assert user is not None
    try:
        settings.save(g.db, study, _form_config(), user.id)
        g.db.commit()
    except InvalidInput as exc:
        g.db.rollback()
        flash(exc.message, "error")
        return _page(study_id, exc.status_code)
    flash("Monitor settings saved.", "success")
    return redirect(url_for("monitor.page", study_id=study_id, _anchor="settings"), 303)


@bp.route("/<int:study_id>/monitor/alerts/<int:alert_id>/acknowledge", methods=["POST"])
@requires(*STAFF)
def acknowledge(study_id: int, alert_id: int) -> Any:
    user = current_user()
    assert user is not None
    studies.get_study(g.db, study_id)
    try:
        alerts.acknowledge(g.db, study_id, alert_id, user)
        g.db.commit()
    except Conflict as exc:
        g.db.rollback()
        flash(exc.message, "error")
        return _page(study_id, exc.status_code)
    flash(f"Alert {alert_id} acknowledged.", "success")
    return redirect(url_for("monitor.page", study_id=study_id, _anchor="alerts"), 303)
