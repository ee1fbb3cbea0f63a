"""The study monitor page (coordinators and admins): every attempt, host and queue of a study,
updated live without a reload, with the study's alerts, budget and alert thresholds.

The page carries the board as JSON; its script (`monitor.js`, served from here because the
portal's Content-Security-Policy allows no inline script) polls `board` with the ETag it holds
and redraws only when the answer is not 304, filtering and sorting in the browser.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, flash, g, redirect, render_template, request, url_for

from app import form_edits
from app.access import STAFF, current_user, requires
from app.api.v1.monitor import board_response
from app.factory import get_context
from app.forms import float_field
from baseline.errors import Conflict, DomainError
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


def _page(
    study_id: int,
    status: int = 200,
    form: Mapping[str, str] | None = None,
    shown: Mapping[str, str] | None = None,
) -> Any:
    """The monitor page; `form` and `shown`: after a refused save, the settings form to show
    again and the settings now (`form_edits.form_again`), so nothing typed is lost."""
    study = studies.get_study(g.db, study_id)
    hub = hub_activity.load(get_context().settings)
    tag = board.version(g.db, study.id, hub=hub)
    found = board.study_board(g.db, study, hub=hub)
    current = _form_of(settings.load(g.db, study.id))
    return render_template(
        "monitor/index.html",
        study=study,
        board=board.board_json(found),
        etag=tag,
        form=form if form is not None else current,
        shown=shown if shown is not None else current,
        webhook_secret=settings.webhook_secret(g.db, study.id),
        poll_ms=POLL_MS,
    ), status


@bp.route("/<int:study_id>/monitor/board")
@requires(*STAFF)
def board_json(study_id: int) -> Response:
    return board_response(study_id)


# The settings form's fields: optional thresholds (empty turns the rule off) and the rules'
# on/off boxes, named as `settings.Thresholds` names them.
_THRESHOLDS = (
    "idle_minutes",
    "snapshot_late_minutes",
    "failure_rate",
    "queue_minutes",
    "spend_share",
)
_BOXES = ("workspace_dead", "host_down")


def _number(value: float | None) -> str:
    """A number as the form shows it: short, and read back as the same number."""
    if value is None:
        return ""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def _form_of(config: settings.MonitorConfig) -> dict[str, str]:
    """The study's monitor settings as the settings form shows them."""
    t = config.thresholds
    return {
        "budget_usd": _number(config.budget_usd),
        **{name: _number(getattr(t, name)) for name in _THRESHOLDS},
        "failure_min_count": str(t.failure_min_count),
        **{name: "on" if getattr(t, name) else "" for name in _BOXES},
        "email_to": ", ".join(config.email_to),
        "webhook_url": config.webhook_url or "",
    }


def _edited_config(current: settings.MonitorConfig) -> settings.MonitorConfig:
    """The settings with what this form changed (`app.form_edits`: only what its user
    touched, so two coordinators saving at once keep each other's thresholds)."""
    touched = form_edits.changed_fields(request.form, _form_of(current), checkboxes=_BOXES)
    data = current.model_dump()
    thresholds = data["thresholds"]
    for name in _THRESHOLDS:
        if name in touched:
            thresholds[name] = float_field(name)
    if "failure_min_count" in touched:
        count = float_field("failure_min_count")
        thresholds["failure_min_count"] = int(count) if count is not None else 4
    for name in _BOXES:
        if name in touched:
            thresholds[name] = name in request.form
    if "budget_usd" in touched:
        data["budget_usd"] = float_field("budget_usd")
    if "email_to" in touched:
        data["email_to"] = request.form.get("email_to", "").replace(";", ",").split(",")
    if "webhook_url" in touched:
        data["webhook_url"] = request.form.get("webhook_url", "").strip() or None
    return settings.parse(data)


@bp.route("/<int:study_id>/monitor/settings", methods=["POST"])
@requires(*STAFF)
def save_settings(study_id: int) -> Any:
    study = studies.get_study(g.db, study_id)
    user = current_user()
    assert user is not None
    try:
        settings.save(g.db, study, _edited_config(settings.load(g.db, study.id)), user.id)
        g.db.commit()
    except DomainError as exc:
        g.db.rollback()
        flash(exc.message, "error")
        current = _form_of(settings.load(g.db, study.id))
        return _page(
            study_id, exc.status_code, form_edits.form_again(request.form, current, _BOXES), current
        )
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
