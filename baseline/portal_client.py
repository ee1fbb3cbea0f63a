"""A small client for a remote portal's /api/v1, authenticated by a personal API token.

The CLI uses it when `--url`/`--token` (or BASELINE_URL/BASELINE_TOKEN) name a portal, and
`analysis.remote` to load a study from one. Standard library only: a notebook or a participant's
machine needs nothing beyond the project's dependencies. The portal's JSON errors
(`{"error", "message"}`) come back as one `RemoteError` with the portal's message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

from baseline.errors import DomainError

URL_ENV = "BASELINE_URL"
TOKEN_ENV = "BASELINE_TOKEN"
TIMEOUT_S = 120.0


class RemoteError(DomainError):
    """The portal refused the request, or could not be reached."""


@dataclass(frozen=True)
class PortalClient:
    url: str
    token: str

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise RemoteError(f"portal URL must start with http:// or https://, got {self.url!r}")
        if not self.token:
            raise RemoteError(f"a portal URL needs an API token (--token or {TOKEN_ENV})")

    def _endpoint(self, path: str) -> str:
        return urljoin(self.url.rstrip("/") + "/", "api/v1/" + path.lstrip("/"))

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self._endpoint(path), data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            raise RemoteError(_message(exc)) from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RemoteError(f"cannot reach the portal at {self.url}: {reason}") from exc

    def get(self, path: str) -> Any:
        return json.loads(self.request("GET", path))

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return json.loads(self.request("POST", path, body if body is not None else {}))

    def study_id(self, name_or_id: str) -> int:
        """A study by id or exact name, among those the token's user may see."""
        rows = self.get("/studies")["studies"]
        for row in rows:
            if str(row["id"]) == name_or_id or row["name"] == name_or_id:
                return int(row["id"])
        raise RemoteError(f"no study {name_or_id!r} on {self.url}")


def _message(exc: urllib.error.HTTPError) -> str:
    body = exc.read()
    try:
        message = json.loads(body).get("message") or exc.reason
    except (ValueError, AttributeError):
        message = exc.reason
    return f"portal answered {exc.code}: {message}"
