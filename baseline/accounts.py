"""Users, passwords, API tokens and invitations.

Passwords are hashed with argon2id; API tokens and invitation tokens are random and only their
sha256 is stored, so a leaked database grants no access.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime, timedelta

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.errors import Conflict, InvalidInput, NotFound
from baseline.models import ApiToken, Invitation, Role, User, utcnow
from baseline.studies import enroll_human

_hasher = PasswordHasher()
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+$")
MIN_PASSWORD = 8
TOKEN_PREFIX = "bl_"


def hash_secret(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def check_password(user: User, password: str) -> bool:
    try:
        return _hasher.verify(user.password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def parse_role(value: str) -> Role:
    try:
        return Role(value)
    except ValueError as exc:
        names = ", ".join(r.value for r in Role)
        raise InvalidInput(f"unknown role {value!r}; expected one of: {names}") from exc


def create_user(
    session: Session,
    email: str,
    name: str,
    password: str,
    role: Role,
    actor_id: int | None = None,
) -> User:
    email = email.strip().lower()
    if not EMAIL_RE.match(email):
        raise InvalidInput(f"not an e-mail address: {email!r}")
    if len(password) < MIN_PASSWORD:
        raise InvalidInput(f"the password must have at least {MIN_PASSWORD} characters")
    if not name.strip():
        raise InvalidInput("the name must not be empty")
    if session.scalar(select(User).where(User.email == email)) is not None:
        raise Conflict(f"a user with e-mail {email} exists already")
    user = User(email=email, name=name.strip(), password_hash=hash_password(password), role=role)
    session.add(user)
    session.flush()
    audit.record(session, "user.create", "user", user.id, actor_id, role=role.value)
    return user


def authenticate(session: Session, email: str, password: str) -> User | None:
    user = session.scalar(select(User).where(User.email == email.strip().lower()))
    if user is None or not user.active or not check_password(user, password):
        return None
    return user


def issue_token(session: Session, user: User, name: str) -> str:
    """Create an API token and return its only clear-text copy."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(
        ApiToken(
            user=user, name=name or "token", prefix=secret[:10], token_hash=hash_secret(secret)
        )
    )
    audit.record(session, "token.create", "user", user.id, user.id, name=name)
    return secret


def user_for_token(session: Session, secret: str) -> User | None:
    token = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_secret(secret)))
    if token is None or token.revoked_at is not None or not token.user.active:
        return None
    token.last_used_at = utcnow()
    return token.user


def revoke_token(session: Session, user: User, token_id: int) -> None:
    token = session.get(ApiToken, token_id)
    if token is None or token.user_id != user.id:
        raise NotFound(f"no token {token_id}")
    token.revoked_at = utcnow()
    audit.record(session, "token.revoke", "user", user.id, user.id, token_id=token_id)


def create_invitation(
    session: Session,
    role: Role,
    ttl: timedelta,
    actor_id: int | None,
    study_id: int | None = None,
    email: str | None = None,
) -> tuple[Invitation, str]:
    """Return the invitation and its clear token (shown once, in the link)."""
    secret = secrets.token_urlsafe(24)
    invitation = Invitation(
        token_hash=hash_secret(secret),
        role=role,
        study_id=study_id,
        email=email.strip().lower() if email else None,
        created_by_id=actor_id,
        expires_at=utcnow() + ttl,
    )
    session.add(invitation)
    session.flush()
    audit.record(session, "invitation.create", "invitation", invitation.id, actor_id, role=role)
    return invitation, secret


class InvitationError(InvalidInput):
    """An invitation link that cannot be used; the message says why."""

    status_code = 410
    code = "invitation_unusable"


def open_invitation(session: Session, secret: str, now: datetime | None = None) -> Invitation:
    invitation = session.scalar(
        select(Invitation).where(Invitation.token_hash == hash_secret(secret))
    )
    now = now or utcnow()
    if invitation is None:
        raise InvitationError(
            "This invitation link is not valid. Ask your coordinator for a new one."
        )
    if invitation.used_at is not None:
        raise InvitationError(
            "This invitation has already been used. Log in with the account it created, "
            "or ask your coordinator for a new invitation."
        )
    if invitation.expires_at <= now:
        raise InvitationError(
            "This invitation has expired. Ask your coordinator for a new invitation."
        )
    return invitation


def accept_invitation(session: Session, secret: str, email: str, name: str, password: str) -> User:
    invitation = open_invitation(session, secret)
    if invitation.email and invitation.email != email.strip().lower():
        raise InvalidInput("This invitation was issued for another e-mail address.")
    user = create_user(session, email, name, password, invitation.role)
    invitation.used_at = utcnow()
    invitation.used_by_id = user.id
    if invitation.study_id is not None and invitation.role is Role.PARTICIPANT:
        enroll_human(session, invitation.study_id, user, actor_id=user.id)
    audit.record(session, "invitation.accept", "invitation", invitation.id, user.id)
    return user
