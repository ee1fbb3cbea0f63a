"""Per-attempt tokens: how an API agent and the workspace's `task` command authenticate.

One mechanism for both. A token opens the workspace routes of exactly one attempt
(``/api/v1/attempts/<id>/workspace/...``) and nothing else: it is not a user's API token, so no
other route accepts it, and it is never the participant's portal credential. Only its sha256 is
stored (`baseline.tokens.hash_secret`). It stops working the moment the attempt ends (the check
below looks at the attempt's state on every call), and `revoke_all` stamps the rows when the
attempt ends so the audit shows when each token died.

Kinds: ``agent`` is issued by a coordinator and handed to an API agent running anywhere;
``workspace`` is issued by Baseline whenever an attempt's container is (re)created and placed in
the container for `task` (`place_in_workspace`), replacing that attempt's earlier workspace token.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from baseline import audit
from baseline.context import Context
from baseline.db import rows_changed
from baseline.errors import Conflict, DomainError, Forbidden, NotFound
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    Attempt,
    AttemptToken,
    Host,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.tokens import hash_secret
from infra.portal_relay import PortalRelay
from infra.workspace import WorkspaceBackend, WorkspaceError, WorkspaceHandle

TOKEN_PREFIX = "bat_"
AGENT = "agent"
WORKSPACE = "workspace"
KINDS = (AGENT, WORKSPACE)

# Where `task` finds its credentials inside the workspace: readable by the workspace user only.
CONFIG_DIR = "/home/participant/.baseline"
CONFIG_FILE = "task.json"
# The loopback port inside the workspace that the portal relay forwards to the portal.
RELAY_PORT_INSIDE = 8749
# How long the relay still serves an ended attempt's container: its last request is answered.
RELAY_AFTER_END_S = 60.0


class TokenRefused(DomainError):
    """No usable token: missing, unknown or revoked (401)."""

    status_code = 401
    code = "unauthorized"


@dataclass(frozen=True)
class Caller:
    """Who is calling through a token: the attempt it opens, and the token's kind."""

    attempt_id: int
    token_id: int
    kind: str


def issue(session: Session, attempt: Attempt, kind: str, actor_id: int | None) -> str:
    """A new token for the attempt; its only clear-text copy is returned."""
    if kind not in KINDS:
        raise ValueError(f"unknown attempt token kind {kind!r}")
    if attempt.ended_at is not None:
        raise Conflict(f"attempt {attempt.id} is {attempt.status.value}: no token for it")
    if kind == WORKSPACE:  # one workspace token at a time: the container holds the newest
        _revoke(session, attempt.id, WORKSPACE)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = AttemptToken(
        attempt_id=attempt.id, kind=kind, prefix=secret[:10], token_hash=hash_secret(secret)
    )
    session.add(token)
    session.flush()
    audit.record(
        session, "attempt_token.issue", "attempt", attempt.id, actor_id, kind=kind,
        token_id=token.id,
    )  # fmt: skip
    return secret


def _revoke(session: Session, attempt_id: int, kind: str | None = None) -> int:
    query = update(AttemptToken).where(
        AttemptToken.attempt_id == attempt_id, AttemptToken.revoked_at.is_(None)
    )
    if kind is not None:
        query = query.where(AttemptToken.kind == kind)
    result = session.execute(query.values(revoked_at=utcnow()))
    return rows_changed(result)


def revoke_all(session: Session, attempt_id: int, actor_id: int | None = None) -> None:
    """The attempt ended: every token of it stops working (audited when there were any)."""
    if _revoke(session, attempt_id):
        audit.record(session, "attempt_token.revoke", "attempt", attempt_id, actor_id)


def authenticate(session: Session, secret: str, attempt_id: int) -> Caller:
    """The caller of `attempt_id`'s workspace routes, or why not.

    Unknown and revoked tokens are `TokenRefused` (401); a valid token of another attempt is
    `Forbidden` (403); a token of an attempt that has not started or has just ended is
    `Conflict` (409; an ended attempt's tokens are revoked, so 401 after that)."""
    if not secret.startswith(TOKEN_PREFIX):
        raise TokenRefused("this route takes an attempt token (bat_...)")
    token = session.scalar(
        select(AttemptToken).where(AttemptToken.token_hash == hash_secret(secret))
    )
    if token is None or token.revoked_at is not None:
        raise TokenRefused("unknown or revoked attempt token")
    if token.attempt_id != attempt_id:
        raise Forbidden(f"this token belongs to another attempt, not to attempt {attempt_id}")
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        raise NotFound(f"no attempt with id {attempt_id}")
    if attempt.ended_at is not None:
        token.revoked_at = token.revoked_at or utcnow()
        raise Conflict(f"attempt {attempt_id} is {attempt.status.value}: its tokens are revoked")
    if attempt.status not in LIVE_ATTEMPT_STATUSES:
        raise Conflict(f"attempt {attempt_id} is {attempt.status.value}: it has not started")
    token.last_used_at = utcnow()
    return Caller(attempt_id=attempt_id, token_id=token.id, kind=token.kind)


def config_json(attempt_id: int, secret: str, url: str) -> str:
    """What `task` reads from CONFIG_DIR/CONFIG_FILE."""
    return json.dumps({"attempt_id": attempt_id, "token": secret, "url": url})


# Written by an exec inside the container, as the workspace user: its home may be a tmpfs
# (bounded scratch), which the engine's archive API does not see.
WRITE_CONFIG = 'umask 077 && mkdir -p -- "$1" && printf %s "$3" > "$1/$2"'


def relay_url() -> str:
    """The portal as `task` reaches it from inside the workspace: the relay's loopback port."""
    return f"http://127.0.0.1:{RELAY_PORT_INSIDE}"


def place_in_workspace(
    session: Session, workspace: Workspace, backend: WorkspaceBackend, handle: WorkspaceHandle
) -> bool:
    """Give a new attempt container its `task` credentials; True when placed.

    Called whenever the container is (re)created, since the file lives in the container's own
    file system: a fresh workspace token replaces the attempt's previous one. Only Docker
    workspaces have the workspace user's home to place it in."""
    if workspace.purpose is not WorkspacePurpose.ATTEMPT or workspace.attempt_id is None:
        return False
    if backend.name != "docker":
        return False
    attempt = session.get(Attempt, workspace.attempt_id)
    if attempt is None or attempt.ended_at is not None:
        return False
    secret = issue(session, attempt, WORKSPACE, None)
    body = config_json(attempt.id, secret, relay_url())
    done = backend.exec(handle, ["sh", "-c", WRITE_CONFIG, "write", CONFIG_DIR, CONFIG_FILE, body],
                        timeout_s=60, user="participant")  # fmt: skip
    if done.exit_code != 0:
        output = done.output.decode("utf-8", errors="replace").strip()[-300:]
        raise WorkspaceError(f"could not place the task credentials: {output}")
    return True


def relay_targets(session: Session, now: datetime | None = None) -> dict[str, tuple[str, str]]:
    """The containers the portal relay serves: workspace name -> (Docker URL, container id) of
    every running workspace of a live attempt, or of one ended less than RELAY_AFTER_END_S ago
    (the request that ended it, `task submit`, is still being answered). Past that its channel
    closes: one `docker exec` per ended attempt, kept for good, grew the portal by every run
    ever made (40 processes, 983 MB with no live attempt)."""
    since = (now or utcnow()) - timedelta(seconds=RELAY_AFTER_END_S)
    rows = session.execute(
        select(Workspace.name, Host.docker_url, Workspace.container_id)
        .join(Host, Workspace.host_id == Host.id)
        .join(Attempt, Workspace.attempt_id == Attempt.id)
        .where(
            Workspace.purpose == WorkspacePurpose.ATTEMPT,
            Workspace.status == WorkspaceStatus.RUNNING,
            or_(Attempt.ended_at.is_(None), Attempt.ended_at > since),
        )
    ).all()
    return {name: (url, container) for name, url, container in rows if url and container}


def portal_relay(ctx: Context, portal_port: int, interval_s: float = 5.0) -> PortalRelay:
    """The relay that lets `task` in every live attempt workspace reach this portal's port."""

    def targets() -> dict[str, tuple[str, str]]:
        with ctx.session() as session:
            return relay_targets(session)

    return PortalRelay(targets, portal_port, RELAY_PORT_INSIDE, interval_s=interval_s)
