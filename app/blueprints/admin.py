"""Administration: accounts (create, deactivate) and the audit log."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, flash, g, redirect, render_template, request, url_for
from sqlalchemy import select

from app.access import current_user, requires
from app.forms import text_field
from baseline import accounts, audit, logins
from baseline.errors import DomainError
from baseline.models import AuditEvent, Role, User

bp = Blueprint("admin", __name__, url_prefix="/admin")
AUDIT_PAGE = 200


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
    events = g.db.scalars(select(AuditEvent).order_by(AuditEvent.id.desc()).limit(AUDIT_PAGE)).all()
    actors = {u.id: u.email for u in g.db.scalars(select(User))}
    return render_template("admin/audit.html", events=events, actors=actors)
