"""The hub's calls to the portal's hub-service routes, authenticated by the shared service token.

The hub never reads Baseline's database: which attempt a hub user may open and where its container
is are the portal's (domain's) answers, so a revoked attempt or a stopped workspace is refused at
the next login or spawn without the hub knowing any rule.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest


class PortalRefused(Exception):
    """The portal said no (or could not be reached); `message` is fit to show the participant."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def call(
    portal_url: str, token: str, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    request = HTTPRequest(
        portal_url.rstrip("/") + path,
        method="POST" if body is not None else "GET",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        body=json.dumps(body) if body is not None else None,
        request_timeout=20,
    )
    try:
        response = await AsyncHTTPClient().fetch(request)
    except HTTPClientError as exc:
        message = f"the portal refused ({exc.code})"
        if exc.response is not None and exc.response.body:
            with contextlib.suppress(ValueError):
                message = str(json.loads(exc.response.body).get("message", message))
        raise PortalRefused(exc.code, message) from exc
    except OSError as exc:
        raise PortalRefused(502, f"the portal at {portal_url} cannot be reached: {exc}") from exc
    data = json.loads(response.body)
    if not isinstance(data, dict):
        raise PortalRefused(502, "the portal answered something that is not an object")
    return data
