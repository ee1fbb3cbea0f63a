"""What each user may see: the object-level half of access control.

Role checks on routes say *which kind* of thing a user may reach; these queries say *which rows*.
A participant sees only studies they are enrolled in and only their own attempts; staff see all.
"""

from __future__ import annotations

from sqlalchemy import Select, false, select
from sqlalchemy.orm import Session

from baseline.errors import NotFound
from baseline.models import Attempt, Participant, Role, Study, User

STAFF_ROLES = frozenset({Role.ADMIN, Role.COORDINATOR})


def studies_query(user: User) -> Select[Study]:
    query = select(Study).order_by(Study.id)
    if user.role is Role.PARTICIPANT:
        enrolled = select(Participant.study_id).where(Participant.user_id == user.id)
        query = query.where(Study.id.in_(enrolled))
    return query


def attempts_query(user: User) -> Select[Attempt]:
    query = select(Attempt).order_by(Attempt.id)
    if user.role is Role.PARTICIPANT:
        query = query.join(Participant).where(Participant.user_id == user.id)
    elif user.role not in STAFF_ROLES:
        # Graders and analysts reach attempts only through their own, blinded areas.
        query = query.where(false())
    return query


def visible_study(session: Session, user: User, study_id: int) -> Study:
    study = session.scalar(studies_query(user).where(Study.id == study_id))
    if study is None:
        raise NotFound(f"no study with id {study_id}")
    return study


def visible_attempt(session: Session, user: User, attempt_id: int) -> Attempt:
    """Another participant's attempt is reported as missing, not as forbidden: no id probing."""
    attempt = session.scalar(attempts_query(user).where(Attempt.id == attempt_id))
    if attempt is None:
        raise NotFound(f"no attempt with id {attempt_id}")
    return attempt
