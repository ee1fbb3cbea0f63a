"""The portal's calls to a running hub (synchronous, bounded): health, a server's activity, every
server's activity as the hub records it, stop, and the end of a hub user's session at the portal
logout.

The portal is a hub service (``baseline-portal``, see `infra.hub.config`); its token carries the
scopes these calls need. Activity is read from the single-user server itself, through the proxy:
``/api/status`` (never counted as activity by the server) for its ``last_activity``, which covers
API calls, kernel messages and terminal input, and ``/api/kernels?no_track_activity=1`` for the
kernels' execution state. The hub's own ``last_activity`` is not used while a server runs: it lags
by minutes and counts any request through the proxy, this probe's included; a busy kernel that
prints nothing is not activity for it either. The study monitor's "last activity" takes the
hub's own record (`servers_activity`, one paged listing for every server): a terminal's input
reaches it within the single-user server's activity interval (minutes), which is soon enough for
an idle alert counted in tens of minutes, and costs one call per evaluation, not one per server.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote
from urllib.request import Request, urlopen


class HubUnreachable(RuntimeError):
    """The hub or the server did not answer as expected; the message says what happened."""


@dataclass(frozen=True)
class ServerActivity:
    """What the hub and the single-user server say about one attempt's server, at one instant."""

    running: bool  # the hub has the server, ready
    last_activity: datetime | None  # the server's (running) or the hub's record (not running)
    busy_kernels: int  # kernels executing right now (0 when not running)


def hub_is_up(public_url: str, timeout_s: float = 3) -> bool:
    """The hub answers through its proxy (a refused or timed-out connection: it is down)."""
    try:
        with urlopen(public_url.rstrip("/") + "/hub/health", timeout=timeout_s) as answer:
            return bool(answer.status == 200)
    except (URLError, OSError):
        return False


def _when(raw: object) -> datetime | None:
    if not isinstance(raw, str) or not raw:
        return None
    when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _call(url: str, token: str, method: str = "GET", timeout_s: float = 15) -> tuple[int, Any]:
    request = Request(url, method=method, headers={"Authorization": f"token {token}"})
    try:
        with urlopen(request, timeout=timeout_s) as answer:
            body = answer.read()
            return int(answer.status), json.loads(body) if body else None
    except HTTPError as exc:
        return int(exc.code), None
    except (URLError, OSError, ValueError) as exc:
        raise HubUnreachable(f"{method} {url}: {exc}") from exc


def server_activity(public_url: str, token: str, user: str, server: str) -> ServerActivity:
    base = public_url.rstrip("/")
    status, record = _call(f"{base}/hub/api/users/{quote(user)}", token)
    if status == 404:
        return ServerActivity(running=False, last_activity=None, busy_kernels=0)
    if status != 200 or not isinstance(record, dict):
        raise HubUnreachable(f"the hub answered {status} about user {user}")
    found = (record.get("servers") or {}).get(server)
    if not found or not found.get("ready"):
        hub_seen = _when((found or {}).get("last_activity") or record.get("last_activity"))
        return ServerActivity(running=False, last_activity=hub_seen, busy_kernels=0)
    prefix = f"{base}/user/{quote(user)}/{quote(server)}/api"
    status, answer = _call(f"{prefix}/status", token)
    if status != 200 or not isinstance(answer, dict):
        raise HubUnreachable(f"server {user}/{server} answered {status} to /api/status")
    status, kernels = _call(f"{prefix}/kernels?no_track_activity=1", token)
    if status != 200 or not isinstance(kernels, list):
        raise HubUnreachable(f"server {user}/{server} answered {status} to /api/kernels")
    busy = sum(1 for k in kernels if isinstance(k, dict) and k.get("execution_state") == "busy")
    return ServerActivity(
        running=True, last_activity=_when(answer.get("last_activity")), busy_kernels=busy
    )


# Users per page of the hub's user listing (its own default and maximum page size).
USERS_PAGE = 200


def servers_activity(
    public_url: str, token: str, timeout_s: float = 10
) -> dict[tuple[str, str], datetime | None]:
    """The hub's ``last_activity`` of every server it has running or starting, by (hub user,
    server name): the users with an active server, listed a page at a time."""
    base = public_url.rstrip("/")
    found: dict[tuple[str, str], datetime | None] = {}
    offset = 0
    while True:
        url = f"{base}/hub/api/users?state=active&offset={offset}&limit={USERS_PAGE}"
        status, users = _call(url, token, timeout_s=timeout_s)
        if status != 200 or not isinstance(users, list):
            raise HubUnreachable(f"the hub answered {status} to listing its users")
        for user in users:
            if not isinstance(user, dict) or not isinstance(user.get("name"), str):
                raise HubUnreachable("the hub's user listing holds a record without a name")
            for name, server in (user.get("servers") or {}).items():
                try:
                    found[(user["name"], name)] = _when((server or {}).get("last_activity"))
                except ValueError as exc:
                    raise HubUnreachable(f"the hub's activity of {user['name']}: {exc}") from exc
        if len(users) < USERS_PAGE:
            return found
        offset += len(users)


def server_ready(public_url: str, token: str, user: str, server: str) -> bool:
    """Whether the hub has this user's server up (the user record only, no call to the
    server): False when the user is unknown (never logged in, or logged out, which deletes it)."""
    status, record = _call(f"{public_url.rstrip('/')}/hub/api/users/{quote(user)}", token)
    if status == 404:
        return False
    if status != 200 or not isinstance(record, dict):
        raise HubUnreachable(f"the hub answered {status} about user {user}")
    return bool(((record.get("servers") or {}).get(server) or {}).get("ready"))


def stop_server(public_url: str, token: str, user: str, server: str) -> bool:
    """Ask the hub to stop one server; True when it was running (False: there was none)."""
    url = f"{public_url.rstrip('/')}/hub/api/users/{quote(user)}/servers/{quote(server)}"
    status, _ = _call(url, token, method="DELETE", timeout_s=60)
    if status in (202, 204):
        return True
    if status in (400, 404):  # no such server, or not running
        return False
    raise HubUnreachable(f"the hub answered {status} to stopping {user}/{server}")


def end_user(public_url: str, token: str, user: str, timeout_s: float = 60) -> bool:
    """End everything a hub user holds: stop each of their servers (its terminals and kernels go
    with it), wait for the stops, then delete the hub user, which revokes every token it had
    (API, OAuth and server tokens) and invalidates its hub cookie (a new login makes a new user
    with a new cookie id). True when there was such a user; the hub makes the user again at the
    next login the portal issues."""
    base = public_url.rstrip("/")
    record_url = f"{base}/hub/api/users/{quote(user)}"
    deadline = time.monotonic() + timeout_s
    asked: set[str] = set()
    while True:
        status, record = _call(record_url, token)
        if status == 404:
            return False
        if status != 200 or not isinstance(record, dict):
            raise HubUnreachable(f"the hub answered {status} about user {user}")
        active = record.get("servers") or {}  # only servers that run or are pending
        if not active:
            break
        for name, server in active.items():
            if name not in asked and server.get("pending") != "stop":
                asked.add(name)
                stop_server(public_url, token, user, name)
        if time.monotonic() > deadline:
            raise HubUnreachable(f"the servers of {user} did not stop: {sorted(active)}")
        time.sleep(0.3)
    status, _ = _call(record_url, token, method="DELETE", timeout_s=60)
    if status not in (204, 404):
        raise HubUnreachable(f"the hub answered {status} to deleting user {user}")
    return True
