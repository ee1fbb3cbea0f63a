"""Administration: accounts (create, deactivate) and the audit log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, flash, g, redirect, render_template, request, url_for
from sqlalchemy import func, select

from app import listing
from app.access import current_user, requires
from app.forms import text_field
from baseline import audit
from baseline.errors import DomainError, InvalidInput
from baseline.models import AuditEvent, Role, User
from baseline.people import accounts, logins

bp = Blueprint("admin", __name__, url_prefix="/admin")
AUDIT_PAGE = 50


@bp.route("/")
@requires(Role.ADMIN)
def index() -> Any:
    users = g.db.scalars(select(User).order_by(User.id)).all()
    return render_template("admin/index.html", users=users, roles=list(Role))


@bp.route("/users", methods=["POST"])
@requires(Role.ADMIN)
def create_user() -> Any:
    actor = current_user()
    assert actor is not None
    try:
        accounts.create_user(
            g.db,
            text_field("email", max_length=320),
            text_field("name", max_length=200),
            request.form.get("password", ""),
            accounts.parse_role(request.form.get("role", "")),
            actor.id,
        )
        g.db.commit()
        flash("Account created.", "success")
    except DomainError as exc:
        g.db.rollback()
        flash(exc.message, "error")
    return redirect(url_for("admin.index"), 303)


@bp.route("/users/<int:user_id>/active", methods=["POST"])
@requires(Role.ADMIN)
def set_active(user_id: int) -> Any:
    actor = current_user()
    assert actor is not None
    user = g.db.get(User, user_id)
    if user is None:
        flash("No such account.", "error")
    elif user.id == actor.id:
        flash("You cannot deactivate your own account.", "error")
    else:
        user.active = request.form.get("active") == "1"
        if not user.active:
            logins.end_all_sessions(g.db, user.id)
        audit.record(g.db, "user.active", "user", user.id, actor.id, active=user.active)
        g.db.commit()
        flash(f"{user.email} is now {'active' if user.active else 'deactivated'}.", "success")
    return redirect(url_for("admin.index"), 303)


@bp.route("/users/<int:user_id>/password", methods=["POST"])
@requires(Role.ADMIN)
def reset_password(user_id: int) -> Any:
    """Set a new password for an account (e.g. after a lock-out); its sessions end."""
    actor = current_user()
    assert actor is not None
    user = g.db.get(User, user_id)
    if user is None:
        flash("No such account.", "error")
        return redirect(url_for("admin.index"), 303)
    try:
        accounts.reset_password(g.db, user, request.form.get("password", ""), actor.id)
        g.db.commit()
        flash(f"The password of {user.email} is reset; its sessions have ended.", "success")
    except DomainError as exc:
        g.db.rollback()
        flash(exc.message, "error")
    return redirect(url_for("admin.index"), 303)


@bp.route("/audit")
@requires(Role.ADMIN)
def audit_log() -> Any:
    """The audit log, newest first, a page at a time; narrowed by action, actor, target, date."""
    query = select(AuditEvent)
    action = request.args.get("action", "").strip()[:100]
    if action:
        query = query.where(AuditEvent.action.startswith(action, autoescape=True))
    actor = request.args.get("actor", "").strip()
    if actor == "system":
        query = query.where(AuditEvent.actor_id.is_(None))
    elif actor:
        actor_id = listing.int_arg("actor")
        query = query.where(AuditEvent.actor_id == actor_id)
    target = request.args.get("target", "").strip()[:50]
    if target:
        query = query.where(AuditEvent.target_type == target)
    target_id = request.args.get("target_id", "").strip()[:100]
    if target_id:
        query = query.where(AuditEvent.target_id == target_id)
    since, until = _date_arg("since"), _date_arg("until")
    if since is not None:
        query = query.where(AuditEvent.at >= since)
    if until is not None:
        query = query.where(AuditEvent.at < until + timedelta(days=1))
    total = g.db.scalar(select(func.count()).select_from(query.subquery())) or 0
    page = listing.page_of(total, AUDIT_PAGE)
    events = g.db.scalars(
        query.order_by(AuditEvent.id.desc()).offset(page.offset).limit(page.size)
    ).all()
    users = g.db.scalars(select(User).order_by(User.email)).all()
    return render_template(
        "admin/audit.html",
        events=events,
        actors={u.id: u.email for u in users},
        users=users,
        actions=sorted(set(g.db.scalars(select(AuditEvent.action).distinct()))),
        targets=sorted(set(g.db.scalars(select(AuditEvent.target_type).distinct()))),
        args=request.args,
        page=page,
        link=listing.link,
    )


def _date_arg(name: str) -> datetime | None:
    raw = request.args.get(name, "").strip()
    if not raw:
        return None
    try:
        return datetime.strptime(raw, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError as exc:
        raise InvalidInput(f"{name}: expected a date as YYYY-MM-DD, got {raw[:40]!r}") from exc
