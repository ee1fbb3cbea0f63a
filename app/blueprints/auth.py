"""Log in, log out, join through an invitation, manage one's API tokens."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from flask import Blueprint, flash, g, redirect, render_template, request, session, url_for
from sqlalchemy import select

from app.access import ANY_USER, PUBLIC, current_user, requires
from baseline.errors import DomainError
from baseline.models import ApiToken, Role, User
from baseline.people import accounts, logins

bp = Blueprint("auth", __name__)


def _safe_next(target: str | None) -> str:
    """Only redirect to paths on this site, never to another host."""
    if target and target.startswith("/") and not target.startswith("//"):
        parsed = urlparse(target)
        if not parsed.netloc:
            return target
    return url_for("studies.index")


@bp.route("/")
@requires(PUBLIC)
def home() -> Any:
    return redirect(url_for("studies.index") if current_user() else url_for("auth.login"))


def _client() -> str:
    return request.remote_addr or "unknown"


def _start_session(user: User) -> None:
    """A fresh cookie (no fixation) naming a new server-side session."""
    session.clear()
    session["sid"] = logins.open_session(g.db, user)
    session.permanent = True
    g.db.commit()


@bp.route("/login", methods=["GET", "POST"])
@requires(PUBLIC)
def login() -> Any:
    if request.method == "POST":
        email = request.form.get("email", "")
        try:
            logins.check_allowed(g.db, email, _client())
        except logins.TooManyAttempts as exc:
            flash(exc.message, "error")
            return render_template("auth/login.html"), exc.status_code
        user = accounts.authenticate(g.db, email, request.form.get("password", ""))
        if user is None:
            logins.record_failure(g.db, email, _client())
            g.db.commit()
            flash("Wrong e-mail or password.", "error")
            return render_template("auth/login.html"), 401
        logins.clear_failures(g.db, email)
        _start_session(user)
        if user.role is Role.PARTICIPANT and not request.args.get("next"):
            return redirect(url_for("participant.landing"))  # their attempt, not the studies
        return redirect(_safe_next(request.args.get("next")))
    return render_template("auth/login.html")


@bp.route("/logout", methods=["POST"])
@requires(PUBLIC)
def logout() -> Any:
    from app.blueprints.hub import end_hub_session

    hub = end_hub_session(current_user())
    sid = session.get("sid")
    if isinstance(sid, str):
        logins.end_session(g.db, sid)
    g.db.commit()
    session.clear()
    flash("You are logged out.", "success")
    if hub.warning is not None:
        flash(hub.warning, "warning")
    return redirect(hub.next_url or url_for("auth.login"))


def _unusable(exc: accounts.InvitationError) -> tuple[str, int]:
    """The page of an invitation link that cannot be used now, titled by why."""
    page = render_template(
        "error.html", status=exc.status_code, heading=exc.title, message=exc.message
    )
    return page, exc.status_code


@bp.route("/invite/<token>", methods=["GET", "POST"])
@requires(PUBLIC)
def invitation(token: str) -> Any:
    try:
        invite = accounts.open_invitation(g.db, token)
    except accounts.InvitationError as exc:
        return _unusable(exc)
    if request.method == "POST":
        try:
            logins.check_allowed(g.db, None, _client())
            user = accounts.accept_invitation(
                g.db,
                token,
                email=request.form.get("email", ""),
                name=request.form.get("name", ""),
                password=request.form.get("password", ""),
            )
        except accounts.InvitationError as exc:
            g.db.rollback()
            return _unusable(exc)
        except DomainError as exc:
            g.db.rollback()
            if exc.message == accounts.UNUSABLE_EMAIL:
                # Probing e-mails through invitation forms counts against the client's limit.
                logins.record_failure(g.db, logins.INVITATION_PROBE, _client())
                g.db.commit()
            flash(exc.message, "error")
            return render_template("auth/invitation.html", invite=invite), exc.status_code
        g.db.commit()
        _start_session(user)
        flash("Welcome! Your account is ready.", "success")
        return redirect(url_for("studies.index"))
    return render_template("auth/invitation.html", invite=invite)


@bp.route("/account", methods=["GET", "POST"])
@requires(*ANY_USER)
def account() -> Any:
    user = current_user()
    assert user is not None
    new_token = None
    if request.method == "POST":
        action = request.form.get("action")
        if action == "create":
            new_token = accounts.issue_token(g.db, user, request.form.get("name", "").strip())
        elif action == "revoke":
            try:
                accounts.revoke_token(g.db, user, int(request.form.get("token_id", "0")))
            except ValueError:
                flash("No such token.", "error")
        elif action == "password":
            return _change_password(user)
        g.db.commit()
    tokens = g.db.scalars(
        select(ApiToken).where(ApiToken.user_id == user.id, ApiToken.revoked_at.is_(None))
    ).all()
    return render_template("auth/account.html", tokens=tokens, new_token=new_token)


def _change_password(user: User) -> Any:
    """Change one's own password; every session ends, this browser gets a new one."""
    new = request.form.get("new_password", "")
    if new != request.form.get("new_password_again", ""):
        flash("The two new passwords differ.", "error")
        return redirect(url_for("auth.account"), 303)
    try:
        accounts.change_password(g.db, user, request.form.get("current_password", ""), new)
    except DomainError as exc:
        g.db.rollback()
        flash(exc.message, "error")
        return redirect(url_for("auth.account"), 303)
    _start_session(user)
    flash("Your password is changed; every other session has been logged out.", "success")
    return redirect(url_for("auth.account"), 303)
