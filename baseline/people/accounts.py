"""Users, passwords, API tokens and invitations.

Passwords are hashed with argon2id; API tokens and invitation tokens are random and only their
sha256 is stored, so a leaked database grants no access.
"""

from __future__ import annotations

import re
import secrets
from datetime import datetime, timedelta
from functools import cache

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from baseline import audit
from baseline.db import rows_changed
from baseline.errors import Conflict, InvalidInput, NotFound
from baseline.models import ApiToken, Invitation, Role, User, utcnow
from baseline.people import logins
from baseline.studies.studies import check_open, enroll_human, get_study, is_open
from baseline.tokens import hash_secret

_hasher = PasswordHasher()
EMAIL_RE = re.compile(r"^[^@\s]+@[^@\s]+$")
MIN_PASSWORD = 8
TOKEN_PREFIX = "bl_"


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def check_password(user: User, password: str) -> bool:
    return _verify(user.password_hash, password)


def _verify(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


@cache
def _dummy_hash() -> str:
    """A hash no password matches, verified for unknown e-mails so that they take as long."""
    return _hasher.hash(secrets.token_urlsafe(32))


def _check_new_password(password: str) -> None:
    if len(password) < MIN_PASSWORD:
        raise InvalidInput(f"the password must have at least {MIN_PASSWORD} characters")


def parse_role(value: str) -> Role:
    try:
        return Role(value)
    except ValueError as exc:
        names = ", ".join(r.value for r in Role)
        raise InvalidInput(f"unknown role {value!r}; expected one of: {names}") from exc


class EmailTaken(Conflict):
    """The e-mail has an account already (said to admins only, never on a public form)."""


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
    _check_new_password(password)
    if not name.strip():
        raise InvalidInput("the name must not be empty")
    password_hash = hash_password(password)  # before the look-up: same time either way
    if session.scalar(select(User).where(User.email == email)) is not None:
        raise EmailTaken(f"a user with e-mail {email} exists already")
    user = User(email=email, name=name.strip(), password_hash=password_hash, role=role)
    session.add(user)
    session.flush()
    audit.record(session, "user.create", "user", user.id, actor_id, role=role.value)
    return user


def authenticate(session: Session, email: str, password: str) -> User | None:
    """The active user with this e-mail and password, or None. An unknown e-mail costs one
    password verification too, so the answer's timing does not tell which e-mails exist."""
    user = session.scalar(select(User).where(User.email == email.strip().lower()))
    if user is None:
        _verify(_dummy_hash(), password)
        return None
    if not check_password(user, password) or not user.active:
        return None
    return user


def change_password(session: Session, user: User, current: str, new: str) -> None:
    """The user's own change: the current password is required; every session ends."""
    if not check_password(user, current):
        raise InvalidInput("The current password is wrong.")
    _set_password(session, user, new, actor_id=user.id)


def reset_password(session: Session, user: User, new: str, actor_id: int) -> None:
    """An administrator sets a new password; every session of the user ends."""
    _set_password(session, user, new, actor_id=actor_id)


def _set_password(session: Session, user: User, new: str, actor_id: int) -> None:
    _check_new_password(new)
    user.password_hash = hash_password(new)
    logins.end_all_sessions(session, user.id)
    audit.record(session, "user.password", "user", user.id, actor_id)


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
    """Return the invitation and its clear token (shown once, in the link). A participant's
    invitation to a closed or archived study is refused now: accepting it would enrol them,
    which the study refuses, and the link would fail only in the invited person's hands."""
    if study_id is not None and role is Role.PARTICIPANT:
        check_open(get_study(session, study_id))
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
    """An invitation link that cannot be used; the message says why, the title in a word."""

    status_code = 410
    code = "invitation_unusable"
    title = "Link no longer valid"


class InvitationOnHold(InvitationError):
    """A participant's link to a study closed since it was made: not gone, it works again once
    the study is active (and the link not expired), so neither 410 nor "no longer valid"."""

    status_code = 409
    code = "invitation_on_hold"
    title = "Study not open to new participants"


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
    if invitation.study_id is not None and invitation.role is Role.PARTICIPANT:
        # Closed since the link was made: enrolling would be refused. Nothing is used up, so
        # the link works again should the study be made active before it expires.
        study = get_study(session, invitation.study_id)
        if not is_open(study):
            raise InvitationOnHold(
                f"This invitation is to the study {study.name!r}, which is {study.status.value} "
                "and takes no new participants now. Ask your coordinator."
            )
    return invitation


UNUSABLE_EMAIL = (
    "This e-mail address cannot be used with this invitation. Use the address your coordinator "
    "invited, or ask them for help."
)


def accept_invitation(session: Session, secret: str, email: str, name: str, password: str) -> User:
    """Create the invited account. The invitation is claimed by one conditional UPDATE before
    anything else is written, so of concurrent requests exactly one wins (the row lock on
    PostgreSQL, the write lock on SQLite) and the others find it used.

    An e-mail that has an account already gets the same message as one the invitation was not
    issued for, so the form does not tell who has an account."""
    invitation = open_invitation(session, secret)
    now = utcnow()
    claimed = session.execute(
        update(Invitation)
        .where(
            Invitation.id == invitation.id,
            Invitation.used_at.is_(None),
            Invitation.expires_at > now,
        )
        .values(used_at=now)
        .execution_options(synchronize_session=False)
    )
    if rows_changed(claimed) != 1:
        raise InvitationError(
            "This invitation has already been used. Log in with the account it created, "
            "or ask your coordinator for a new invitation."
        )
    if invitation.email and invitation.email != email.strip().lower():
        raise InvalidInput(UNUSABLE_EMAIL)
    try:
        user = create_user(session, email, name, password, invitation.role)
    except EmailTaken as exc:
        raise InvalidInput(UNUSABLE_EMAIL) from exc
    invitation.used_at = now
    invitation.used_by_id = user.id
    if invitation.study_id is not None and invitation.role is Role.PARTICIPANT:
        enroll_human(session, invitation.study_id, user, actor_id=user.id)
    audit.record(session, "invitation.accept", "invitation", invitation.id, user.id)
    return user
