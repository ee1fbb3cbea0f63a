"""Per-attempt keys for the model passthrough: the only secret a command agent holds.

A command agent runs inside the workspace, where the participant's code runs too, so whatever
key it holds can leak. It therefore never gets the provider's key: it gets a key that Baseline
issued for its one attempt, which the passthrough (`baseline.runs.model_passthrough`) accepts for
that attempt's model calls only, while the attempt is live. The key is kept apart from the portal's
API tokens and the workspace API's agent tokens on purpose (least privilege): it opens nothing
but the model. Only its sha256 is stored; the plain key exists in the agent's environment.
"""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.models import ModelKey, utcnow

PREFIX = "bl-model-"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def issue(session: Session, attempt_id: int) -> str:
    """A fresh key for the attempt (earlier ones stay valid until revoked); the plain key."""
    key = PREFIX + secrets.token_urlsafe(32)
    session.add(ModelKey(attempt_id=attempt_id, key_sha256=_digest(key)))
    session.flush()
    return key


def attempt_of(session: Session, key: str) -> int | None:
    """The attempt a valid (issued, not revoked) key belongs to, or None."""
    if not key.startswith(PREFIX):
        return None
    row = session.scalar(select(ModelKey).where(ModelKey.key_sha256 == _digest(key)))
    if row is None or row.revoked_at is not None:
        return None
    return row.attempt_id


def revoke_all(session: Session, attempt_id: int) -> int:
    """Revoke every key of the attempt (it ended); how many were revoked."""
    rows = session.scalars(
        select(ModelKey).where(ModelKey.attempt_id == attempt_id, ModelKey.revoked_at.is_(None))
    ).all()
    now = utcnow()
    for row in rows:
        row.revoked_at = now
    return len(rows)
