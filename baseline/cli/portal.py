"""`--url`/`--token` for commands that can act on a remote portal through its API.

Given a URL (or BASELINE_URL), the command calls /api/v1 with the token (or BASELINE_TOKEN) as
the token's user, with that user's role checks; without one it works on the local database.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from baseline.portal_client import TOKEN_ENV, URL_ENV, PortalClient

F = TypeVar("F", bound=Callable[..., Any])


def portal_options(command: F) -> F:
    """Add --url and --token (also read from BASELINE_URL and BASELINE_TOKEN)."""
    command = click.option(
        "--token",
        envvar=TOKEN_ENV,
        help=f"API token for --url (env {TOKEN_ENV}); create one on the portal's account page.",
    )(command)
    return click.option(
        "--url",
        envvar=URL_ENV,
        help=f"Act on this portal through its API (env {URL_ENV}) instead of the local database.",
    )(command)


def client_for(url: str | None, token: str | None) -> PortalClient | None:
    """The remote portal to act on, or None for the local database."""
    if not url:
        return None
    return PortalClient(url, token or "")
