"""JupyterHub sessions in the domain: who may open which attempt's workspace, and the login token.

The portal is the hub's identity provider (JupyterHub's forced-login pattern): "Open workspace"
issues a one-time login token for one of the participant's own live attempts, the browser carries
it to the hub's ``/hub/login``, and the hub's authenticator redeems it here through the portal's
hub-service route. Only the token's sha256 is stored; it is short-lived and single-use, so a
leaked URL is worth nothing once used. The first successful redemption ends the attempt's
``not_started`` pause (`attempts.first_login`): the clock follows the human's first hub login.

Names on the hub: a portal user is hub user ``u<user id>``; an attempt is the named server
``a<attempt id>`` of that user, so a participant's servers are exactly their attempts, and the
spawner asks `server_target` (again through the portal) where that attempt's container is.

A hub session ends with the portal session: `end_hub_session` at the portal's logout, and
otherwise at the hub's next auth refresh (`portal_session_live`). A hub login is bound to the one
portal session that issued its token, not to the user: the token records that session, and its
redemption the hub's session id of the browser that spent it (sha256 only, like the token), so
that ending the portal session in one browser ends the hub login there while the participant's
login in another browser, from another portal session, stays.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.attempts import attempts, clock, schedule
from baseline.context import Context
from baseline.errors import Conflict, Forbidden, NotFound
from baseline.models import (
    Attempt,
    Host,
    HubLoginToken,
    ParticipantKind,
    PauseReason,
    Role,
    User,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.people import logins
from baseline.tokens import hash_secret
from infra.hub import hub_api
from infra.hub.names import hub_username, server_name

LOGIN_TOKEN_TTL = timedelta(seconds=120)
_HUB_USER = re.compile(r"^u([0-9]{1,12})$")
_SERVER = re.compile(r"^a([0-9]{1,12})$")


def spawn_path(user_id: int, attempt_id: int) -> str:
    """Where the hub sends a freshly logged-in participant: start (or reach) that server."""
    return f"/hub/spawn/{hub_username(user_id)}/{server_name(attempt_id)}"


@dataclass(frozen=True)
class LoginGrant:
    token: str
    next_path: str


@dataclass(frozen=True)
class Redeemed:
    hub_user: str
    attempt_id: int
    clock_started: bool
    # For an observer: the hub role (JupyterHub's authenticator-managed roles) that lets them
    # into that one server; None for a participant (their roles are left alone).
    roles: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class ServerTarget:
    """Where the spawner finds an attempt's workspace: the engine and the container."""

    attempt_id: int
    docker_url: str
    container: str


def _attempt_workspace(session: Session, attempt: Attempt) -> Workspace | None:
    return session.scalar(
        select(Workspace).where(
            Workspace.attempt_id == attempt.id,
            Workspace.purpose == WorkspacePurpose.ATTEMPT,
            Workspace.status != WorkspaceStatus.DESTROYED,
        )
    )


def openable_attempt(session: Session, user: User, attempt_id: int) -> tuple[Attempt, Workspace]:
    """The user's own live human attempt and its running workspace, or a domain error saying why.

    Nobody opens another person's attempt through this path (staff observation is a separate,
    audited action); another participant's attempt is reported missing, as everywhere else.
    """
    attempt = session.get(Attempt, attempt_id)
    if attempt is None or attempt.participant.user_id != user.id:
        raise NotFound(f"no attempt with id {attempt_id}")
    if attempt.participant.kind is not ParticipantKind.HUMAN:
        raise Conflict(f"attempt {attempt_id} is an agent's: it has no JupyterLab")
    if not schedule.is_live(attempt):
        why = f" ({attempt.end_reason})" if attempt.end_reason else ""
        after = (
            ": your final snapshot was taken and the workspace is now read-only"
            if attempt.ended_at is not None
            else ""
        )
        raise Conflict(
            f"attempt {attempt_id} is {attempt.status.value}{why}: its workspace cannot be "
            f"opened{after}"
        )
    current = clock.open_pause(attempt)
    if current is not None and current.reason in clock.HELD_REASONS:
        raise Conflict(
            f"attempt {attempt_id} is paused ({current.reason.value}): its workspace is held "
            "still until the clock resumes"
            + (
                " (resume it on the attempt page)"
                if current.reason is PauseReason.PARTICIPANT
                else ""
            )
        )
    workspace = _attempt_workspace(session, attempt)
    if workspace is None or workspace.status is not WorkspaceStatus.RUNNING:
        state = "missing" if workspace is None else workspace.status.value
        raise Conflict(f"the workspace of attempt {attempt_id} is not running ({state})")
    return attempt, workspace


def issue_login_token(
    session: Session,
    user: User,
    attempt_id: int,
    *,
    portal_session: int,
    now: datetime | None = None,
) -> LoginGrant:
    """A one-time login for the user's own openable attempt, made from portal session row
    `portal_session` (`logins.live_session_id`): the hub login lasts as long as that session."""
    openable_attempt(session, user, attempt_id)
    at = now or utcnow()
    token = secrets.token_urlsafe(32)
    session.add(
        HubLoginToken(
            token_hash=hash_secret(token),
            user_id=user.id,
            attempt_id=attempt_id,
            created_at=at,
            expires_at=at + LOGIN_TOKEN_TTL,
            user_session_id=portal_session,
        )
    )
    audit.record(session, "hub.login_token", "attempt", attempt_id, user.id)
    return LoginGrant(token=token, next_path=spawn_path(user.id, attempt_id))


def redeem_login_token(
    ctx: Context, token: str, hub_session: str, now: datetime | None = None
) -> Redeemed:
    """Spend the token (once, unexpired, attempt still openable); start the clock at first login.
    `hub_session` is the hub's session id of the browser spending it, which the hub's refresh
    names later (`portal_session_live`)."""
    at = now or utcnow()
    with ctx.session() as session:
        row = session.scalar(
            select(HubLoginToken).where(HubLoginToken.token_hash == hash_secret(token))
        )
        if row is None or row.used_at is not None or row.expires_at <= at:
            raise Forbidden("this workspace link is unknown, used or expired: open it again")
        row.used_at = at
        row.hub_session_hash = hash_secret(hub_session)
        user = session.get(User, row.user_id)
        if user is None or not user.active:
            raise Forbidden("this account is not active")
        if row.observer:
            return _redeem_observer(session, user, row.attempt_id)
        openable_attempt(session, user, row.attempt_id)
        user_id, attempt_id = user.id, row.attempt_id
        audit.record(session, "hub.login", "attempt", attempt_id, user_id)
    started = attempts.first_login(ctx, attempt_id, user_id, now=at)
    attempts.end_idle(ctx, attempt_id, user_id, now=at)  # opening the workspace is activity
    return Redeemed(hub_user=hub_username(user_id), attempt_id=attempt_id, clock_started=started)


def end_hub_session(session: Session, public_url: str, service_token: str, user: User) -> bool:
    """What a portal logout does on the hub: every server of the user stops (its open terminals
    and kernels with it) and the hub user is deleted, which revokes every token the hub issued
    them (a token they kept, the server's OAuth token in their cookie) and their hub cookie. The
    next "Open workspace" makes them anew. Audited with its real result; False when the hub could
    not be told (it is down or refused), so that the logout page can say so."""
    try:
        if not hub_api.hub_is_up(public_url):
            raise hub_api.HubUnreachable("the hub is not answering")
        had = hub_api.end_user(public_url, service_token, hub_username(user.id))
    except hub_api.HubUnreachable as exc:
        audit.record(session, "hub.logout_failed", "user", user.id, user.id, reason=str(exc))
        return False
    audit.record(session, "hub.logout", "user", user.id, user.id, had_hub_user=had)
    return True


OBSERVERS = (Role.ADMIN, Role.COORDINATOR)


def observe_path(attempt: Attempt) -> str:
    return f"/user/{hub_username(_participant_user_id(attempt))}/{server_name(attempt.id)}/lab"


def _participant_user_id(attempt: Attempt) -> int:
    user_id = attempt.participant.user_id
    if attempt.participant.kind is not ParticipantKind.HUMAN or user_id is None:
        raise Conflict(f"attempt {attempt.id} is an agent's: it has no JupyterLab to observe")
    return user_id


def _observable(session: Session, staff: User, attempt_id: int) -> Attempt:
    if staff.role not in OBSERVERS or not staff.active:
        raise Forbidden("only coordinators and admins observe a participant's workspace")
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        raise NotFound(f"no attempt with id {attempt_id}")
    _participant_user_id(attempt)
    if not schedule.is_live(attempt):
        raise Conflict(f"attempt {attempt_id} is {attempt.status.value}: nothing to observe")
    return attempt


def issue_observe_token(
    session: Session,
    staff: User,
    attempt_id: int,
    *,
    portal_session: int,
    now: datetime | None = None,
) -> LoginGrant:
    """Staff open a participant's JupyterLab only through this explicit, audited action: a
    one-time login to the hub as themselves, with access to that one server (`Redeemed.roles`),
    lasting as long as their portal session `portal_session`. It neither starts nor resumes the
    participant's clock."""
    attempt = _observable(session, staff, attempt_id)
    at = now or utcnow()
    token = secrets.token_urlsafe(32)
    session.add(
        HubLoginToken(
            token_hash=hash_secret(token),
            user_id=staff.id,
            attempt_id=attempt_id,
            created_at=at,
            expires_at=at + LOGIN_TOKEN_TTL,
            observer=True,
            user_session_id=portal_session,
        )
    )
    audit.record(session, "hub.observe", "attempt", attempt_id, staff.id)
    return LoginGrant(token=token, next_path=observe_path(attempt))


def check_observable_now(
    session: Session, public_url: str, service_token: str, attempt_id: int
) -> None:
    """Refuse, saying why, to observe a JupyterLab that is not running: the hub would answer
    "404: No such user" for a participant who has not logged in yet or has logged out (the
    logout deletes their hub user)."""
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        return  # issue_observe_token names the missing attempt
    user = hub_username(_participant_user_id(attempt))
    try:
        ready = hub_api.server_ready(public_url, service_token, user, server_name(attempt_id))
    except hub_api.HubUnreachable as exc:
        raise Conflict(f"JupyterHub did not say whether the workspace is open: {exc}") from exc
    if not ready:
        raise Conflict(
            "the participant's JupyterLab is not running now (not opened yet, or they logged "
            "out, which closes it): there is nothing to observe until they open it again"
        )


def _redeem_observer(session: Session, staff: User, attempt_id: int) -> Redeemed:
    attempt = _observable(session, staff, attempt_id)
    server = f"{hub_username(_participant_user_id(attempt))}/{server_name(attempt_id)}"
    observer = hub_username(staff.id)
    audit.record(session, "hub.observe_login", "attempt", attempt_id, staff.id, server=server)
    role = {
        "name": f"observe-{server.replace('/', '-')}",
        "description": f"Baseline: observe {server} (audited portal action)",
        "scopes": [
            f"access:servers!server={server}",
            f"read:servers!server={server}",
            # Who they are, which the single-user server's OAuth asks the hub (and nothing more
            # of their own: this role replaces the default `user` role on their hub user).
            f"read:users:name!user={observer}",
            f"read:users:groups!user={observer}",
        ],
    }
    return Redeemed(hub_user=observer, attempt_id=attempt_id, clock_started=False, roles=[role])


def portal_session_live(
    session: Session, hub_user: str, hub_session: str | None, now: datetime | None = None
) -> bool:
    """Whether the hub login of hub user ``u<id>`` in the browser whose hub session id is
    `hub_session` still stands on a live portal session: the one that issued the token last
    redeemed in that browser. The hub's authenticator asks at its auth refresh age
    (`infra.hub.authenticator`): that portal session expired or revoked, without a logout to end
    the hub user, ends the hub login in that browser, whatever the user's other sessions. A
    browser with no login bound to a portal session (one made before logins were bound) is not
    live: the participant opens the workspace from the portal again.

    With `hub_session` None (a request made with a hub server's own token, which belongs to no
    browser) the question is whether the user holds any live portal session."""
    match = _HUB_USER.match(hub_user)
    if match is None:
        raise NotFound(f"{hub_user!r} is not a portal user's hub name")
    user_id = int(match.group(1))
    if hub_session is None:
        return logins.has_live_session(session, user_id, now)
    portal_session = session.scalar(
        select(HubLoginToken.user_session_id)
        .where(
            HubLoginToken.user_id == user_id,
            HubLoginToken.hub_session_hash == hash_secret(hub_session),
            HubLoginToken.used_at.is_not(None),
        )
        .order_by(HubLoginToken.used_at.desc(), HubLoginToken.id.desc())
        .limit(1)
    )
    return portal_session is not None and logins.session_is_live(session, portal_session, now)


def server_target(session: Session, hub_user: str, name: str) -> ServerTarget:
    """The container behind hub user ``u<id>``'s server ``a<attempt>``, if they may open it."""
    user_match, server_match = _HUB_USER.match(hub_user), _SERVER.match(name)
    if user_match is None or server_match is None:
        raise NotFound(f"no workspace for server {hub_user}/{name}: open it from the portal")
    user = session.get(User, int(user_match.group(1)))
    if user is None or not user.active:
        raise Forbidden(f"hub user {hub_user} is not an active portal account")
    attempt, workspace = openable_attempt(session, user, int(server_match.group(1)))
    host = session.get(Host, workspace.host_id) if workspace.host_id is not None else None
    if host is None:
        raise Conflict(f"the workspace of attempt {attempt.id} has no host")
    return ServerTarget(attempt_id=attempt.id, docker_url=host.docker_url, container=workspace.name)
