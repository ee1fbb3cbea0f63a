"""Names on the hub: portal user ``N`` is hub user ``uN``; attempt ``M`` is its server ``aM``.

One place for the convention, so the portal's hub sessions, the idle watch and the end-of-attempt
freeze all address the same server.
"""

from __future__ import annotations


def hub_username(user_id: int) -> str:
    return f"u{user_id}"


def server_name(attempt_id: int) -> str:
    return f"a{attempt_id}"
