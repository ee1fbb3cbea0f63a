"""Browser sessions kept on the server, and the login rate limit.

A session cookie signed by the portal can be copied; if it carried the user id, logging out would
only delete the browser's copy. So the cookie carries a random session id whose sha256 is a row in
`user_sessions`, checked on every request: logout, a password change and a deactivation revoke the
row and every copy of the cookie stops working.

Refused logins are rows in `login_failures`, counted per e-mail (known or not, so a lock-out says
nothing about whether an account exists) and per client address, in the database so the limit
holds across every process of the portal.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from baseline.errors import DomainError
from baseline.models import LoginFailure, User, UserSession, utcnow
from baseline.tokens import hash_secret

SESSION_LIFETIME = timedelta(hours=12)
FAILURE_WINDOW = timedelta(minutes=15)
MAX_FAILURES_PER_EMAIL = 5
MAX_FAILURES_PER_CLIENT = 20


class TooManyAttempts(DomainError):
    """Too many refused logins for this e-mail or from this client in the window."""

    status_code = 429
    code = "too_many_attempts"


def open_session(db: Session, user: User, now: datetime | None = None) -> str:
    """Start a session for `user`; return the clear id for the cookie (stored only hashed)."""
    secret = secrets.token_urlsafe(32)
    now = now or utcnow()
    db.add(
        UserSession(
            user_id=user.id,
            token_hash=hash_secret(secret),
            created_at=now,
            expires_at=now + SESSION_LIFETIME,
        )
    )
    db.flush()
    return secret


def user_for_session(db: Session, secret: str, now: datetime | None = None) -> User | None:
    """The active user of a live session, or None (unknown, revoked, expired, deactivated)."""
    row = db.scalar(select(UserSession).where(UserSession.token_hash == hash_secret(secret)))
    if row is None or row.revoked_at is not None or row.expires_at <= (now or utcnow()):
        return None
    user = db.get(User, row.user_id)
    return user if user is not None and user.active else None


def live_session_id(db: Session, secret: str, now: datetime | None = None) -> int | None:
    """The row id of the live session behind a cookie's secret, or None: what a hub login token
    records, so that the hub login it makes ends with this session (`session_is_live`)."""
    row = db.scalar(select(UserSession).where(UserSession.token_hash == hash_secret(secret)))
    if row is None or row.revoked_at is not None or row.expires_at <= (now or utcnow()):
        return None
    return row.id


def session_is_live(db: Session, session_id: int, now: datetime | None = None) -> bool:
    """Whether session row `session_id` is neither revoked nor expired and its user is active:
    what JupyterHub re-checks for the hub login that session made (in that browser only)."""
    row = db.get(UserSession, session_id)
    if row is None or row.revoked_at is not None or row.expires_at <= (now or utcnow()):
        return False
    user = db.get(User, row.user_id)
    return user is not None and user.active


def has_live_session(db: Session, user_id: int, now: datetime | None = None) -> bool:
    """Whether an active user holds a session neither revoked nor expired (in any browser):
    what JupyterHub re-checks for requests made with a hub server's own token, which belong to
    no browser's login."""
    user = db.get(User, user_id)
    if user is None or not user.active:
        return False
    live = db.scalar(
        select(UserSession.id)
        .where(
            UserSession.user_id == user_id,
            UserSession.revoked_at.is_(None),
            UserSession.expires_at > (now or utcnow()),
        )
        .limit(1)
    )
    return live is not None


def end_session(db: Session, secret: str) -> None:
    db.execute(
        update(UserSession)
        .where(UserSession.token_hash == hash_secret(secret), UserSession.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )


def end_all_sessions(db: Session, user_id: int) -> None:
    """Revoke every live session of a user (password change, reset, deactivation)."""
    db.execute(
        update(UserSession)
        .where(UserSession.user_id == user_id, UserSession.revoked_at.is_(None))
        .values(revoked_at=utcnow())
    )


def normalise_email(email: str) -> str:
    return email.strip().lower()[:320]


INVITATION_PROBE = "(invitation)"


def check_allowed(db: Session, email: str | None, client: str, now: datetime | None = None) -> None:
    """Refuse (429) when the e-mail (None: not checked) or the client has too many recent
    failures."""
    since = (now or utcnow()) - FAILURE_WINDOW
    recent = select(func.count(LoginFailure.id)).where(LoginFailure.at > since)
    by_email = 0
    if email is not None:
        by_email = db.scalar(recent.where(LoginFailure.email == normalise_email(email))) or 0
    by_client = db.scalar(recent.where(LoginFailure.client == client[:64])) or 0
    if by_email >= MAX_FAILURES_PER_EMAIL or by_client >= MAX_FAILURES_PER_CLIENT:
        minutes = int(FAILURE_WINDOW.total_seconds() // 60)
        raise TooManyAttempts(
            f"Too many failed attempts. Wait {minutes} minutes and try again, "
            "or ask an administrator to reset your password."
        )


def record_failure(db: Session, email: str, client: str) -> None:
    db.add(LoginFailure(email=normalise_email(email), client=client[:64]))
    db.flush()


def clear_failures(db: Session, email: str) -> None:
    """A successful login forgives the account's failures (not the client's)."""
    db.execute(delete(LoginFailure).where(LoginFailure.email == normalise_email(email)))
