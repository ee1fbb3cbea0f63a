"""Audit trail: every state change made through the domain layer records who did it."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from baseline.models import AuditEvent


def record(
    session: Session,
    action: str,
    target_type: str,
    target_id: object | None = None,
    actor_id: int | None = None,
    **details: Any,
) -> AuditEvent:
    event = AuditEvent(
        action=action,
        target_type=target_type,
        target_id=None if target_id is None else str(target_id),
        actor_id=actor_id,
        details=details,
    )
    session.add(event)
    return event
