"""The judge's HTTP path to an OpenAI-compatible ``/chat/completions``: the SDK's headers and
error types over the standard library's keep-alive connections.

Why not ``client.chat.completions.create``: the judge is one Python process, and its CPU, not the
provider, is what stretched a grading of thousands of leaves past calls x latency / concurrency.
Per call the SDK walks the messages and the schema through its type-driven transform, builds a
request-options model, re-parses the URL and merges header sets, and its HTTP stack (httpx,
httpcore, h11: pure Python) parses and validates every header again; together several times the
CPU of the rest of the judge. httpcore's pool, shared by a hundred threads, also scans every
connection under one lock whenever a request starts or a response closes. The judge sends one
request shape with plain-JSON parameters, so it is built here once, with the headers the SDK
would send (key, user agent, organisation), and each call in flight takes a connection of its
own (``http.client``), reused most-recent-first so it stays warm.
Failures raise the SDK's exception classes, chosen by status as the SDK chooses them, so callers
and their retry rules see the errors they saw before.

Proxies: as the SDK's HTTP client did, ``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` from the
environment apply (an HTTPS endpoint through a ``CONNECT`` tunnel, an HTTP one in absolute form).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import httpx2
import openai

_STATUS_ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError,
    401: openai.AuthenticationError,
    403: openai.PermissionDeniedError,
    404: openai.NotFoundError,
    409: openai.ConflictError,
    422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}
# A kept-alive connection the server has closed in the meantime fails like this before any answer
# arrives; the request is sent again once on a fresh connection (a judge call is safe to repeat),
# rather than counted as a failed attempt with a back-off.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass(frozen=True)
class Answer:
    """A 2xx response: its headers (names in lower case) and body."""

    headers: dict[str, str]
    body: bytes


def status_error(
    request: httpx2.Request, status: int, headers: dict[str, str], body: bytes
) -> openai.APIStatusError:
    """The SDK's exception for an error response, with the SDK's message and body."""
    response = httpx2.Response(status, headers=headers, content=body, request=request)
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        parsed = body.decode(errors="replace") or None
    data = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    message = f"Error code: {status} - {parsed}"
    cls = _STATUS_ERRORS.get(status)
    if cls is None:
        cls = openai.InternalServerError if status >= 500 else openai.APIStatusError
    return cls(message, response=response, body=data)


def sdk_headers(api_key: str) -> dict[str, str]:
    """The headers the SDK sends on a call (less its telemetry), organisation and project from
    the environment as the SDK reads them."""
    headers = {
        "Accept": "application/json",
        "Content-Type": "application/json",
        "User-Agent": f"OpenAI/Python {openai.__version__}",
        "Authorization": f"Bearer {api_key}",
    }
    for name, env in (
        ("OpenAI-Organization", "OPENAI_ORG_ID"),
        ("OpenAI-Project", "OPENAI_PROJECT_ID"),
    ):
        if value := os.environ.get(env):
            headers[name] = value
    return headers


class ChatTransport:
    """Thread-safe POSTs of chat-completion bodies to one endpoint."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = sdk_headers(api_key)
        self._timeout_s = timeout_s
        target = urllib.parse.urlsplit(self._url)
        self._https = target.scheme == "https"
        self._host = target.hostname or ""
        self._port = target.port or (443 if self._https else 80)
        self._path = target.path + (f"?{target.query}" if target.query else "")
        self._tls = httpx2.create_ssl_context() if self._https else None
        self._proxy = _proxy_for(target)
        self._tunnel_headers: dict[str, str] = {}
        if self._proxy is not None and self._proxy.username is not None:
            user = urllib.parse.unquote(self._proxy.username)
            password = urllib.parse.unquote(self._proxy.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            if self._https:  # said to the proxy in CONNECT, never to the endpoint
                self._tunnel_headers = {"Proxy-Authorization": f"Basic {token}"}
            else:  # plain HTTP goes through the proxy as it is
                self._headers["Proxy-Authorization"] = f"Basic {token}"
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []

    def post(self, body: dict[str, Any]) -> Answer:
        """Send `body`; the answer of a 2xx, else the SDK's exception for the failure."""
        content = json.dumps(body).encode()
        conn, reused = self._checkout()
        try:
            try:
                status, headers, data = self._exchange(conn, content)
            except _STALE:
                if not reused:
                    raise
                conn.close()
                status, headers, data = self._exchange(conn, content)
        except TimeoutError as exc:
            conn.close()
            raise openai.APITimeoutError(request=self._request(content)) from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise openai.APIConnectionError(request=self._request(content)) from exc
        self._checkin(conn)
        if status >= 300:
            raise status_error(self._request(content), status, headers, data)
        return Answer(headers, data)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _exchange(
        self, conn: http.client.HTTPConnection, content: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        path = self._path if self._proxy is None or self._https else self._url
        conn.request("POST", path, body=content, headers=self._headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    def _request(self, content: bytes) -> httpx2.Request:
        """The request as the SDK's exceptions describe it (made only for a failure)."""
        return httpx2.Request("POST", self._url, headers=self._headers, content=content)

    def _checkout(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _checkin(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._idle.append(conn)

    def _connect(self) -> http.client.HTTPConnection:
        """A connection, opened by its first request (so a refusal is an `APIConnectionError`);
        ``http.client`` sets TCP_NODELAY, so a request's headers and body go out at once."""
        host, port = self._host, self._port
        if self._proxy is not None:
            host, port = self._proxy.hostname or "", self._proxy.port or 80
        if not self._https:
            return http.client.HTTPConnection(host, port, timeout=self._timeout_s)
        conn = http.client.HTTPSConnection(host, port, timeout=self._timeout_s, context=self._tls)
        if self._proxy is not None:
            conn.set_tunnel(self._host, self._port, headers=self._tunnel_headers)
        return conn


def _proxy_for(target: urllib.parse.SplitResult) -> urllib.parse.SplitResult | None:
    """The environment's proxy for `target` (None when none applies or NO_PROXY exempts it)."""
    proxy = urllib.request.getproxies().get(target.scheme)
    if not proxy or urllib.request.proxy_bypass(target.netloc):
        return None
    if "://" not in proxy:
        proxy = "http://" + proxy
    return urllib.parse.urlsplit(proxy)
