"""The mitmproxy addon that enforces each workspace's egress policy and logs every request.

Runs inside mitmdump, in the proxy's own venv (`scripts/services/25-egress.sh`): it imports only
the standard library, mitmproxy and `rules.py` beside it, never `baseline`. A workspace
authenticates with its proxy URL (`http://WORKSPACE:TOKEN@proxy:port`); the credentials of a
CONNECT are remembered for the TLS connection it opens, so that requests inside HTTPS (decrypted
with the proxy's CA) are matched on host and path too. Refusals are answered 403 (407 without
valid credentials). Each request becomes one JSON line in the event log, flushed at once.

Options (`--set NAME=VALUE`): `egress_config` (the JSON policy file, re-read when it changes) and
`egress_log` (the JSON-lines event log), `egress_allow_private` (let workspaces reach loopback and
private addresses; off except in tests, whose servers are on 127.0.0.1). Private destinations are
refused by name or address in the request and by every address the name resolves to, before the
request or tunnel is logged: a refusal is logged refused, with its rule, never allowed. They are
checked once more when the server connection opens (the name may resolve differently by then).
`egress_deny_networks` (comma-separated CIDRs: the workspace networks) are refused the same way
whatever `egress_allow_private` says, so that no workspace reaches another through the proxy.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mitmproxy import ctx, http, tcp

_spec = importlib.util.spec_from_file_location(
    "baseline_egress_rules", Path(__file__).resolve().parent / "rules.py"
)
assert _spec is not None and _spec.loader is not None
rules = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rules
_spec.loader.exec_module(rules)

_UNAUTHENTICATED = "unauthenticated"


def _now() -> str:
    return datetime.now(UTC).isoformat()


class EgressFilter:
    def __init__(self) -> None:
        self._config_mtime: float | None = None
        self._policies: dict[str, Any] = {}
        self._identities: dict[str, str] = {}  # client connection id -> workspace name
        self._log: Any = None

    def load(self, loader: Any) -> None:
        loader.add_option("egress_config", str, "", "JSON file of per-workspace egress policies")
        loader.add_option("egress_log", str, "", "JSON-lines file every request is logged to")
        loader.add_option(
            "egress_allow_private", bool, False, "let workspaces reach private addresses"
        )
        loader.add_option(
            "egress_deny_networks", str, "", "CIDRs never reachable (the workspace networks)"
        )

    def configure(self, updated: set[str]) -> None:
        if "egress_log" in updated and ctx.options.egress_log:
            self._log = open(ctx.options.egress_log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        if "egress_config" in updated:
            self._config_mtime = None
            self._policies_now()

    def _policies_now(self) -> dict[str, Any]:
        path = ctx.options.egress_config
        if not path:
            return {}
        mtime = os.stat(path).st_mtime_ns
        if mtime != self._config_mtime:
            self._policies = rules.load_config(Path(path).read_text())
            self._config_mtime = mtime
        return self._policies

    def _write(self, workspace: str, method: str, url: str, decision: Any, **extra: Any) -> None:
        if self._log is None:
            return
        self._log.write(rules.event_line(_now(), workspace, method, url, decision, **extra) + "\n")

    def _authenticate(self, flow: http.HTTPFlow) -> str | None:
        header = flow.request.headers.get("Proxy-Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, token = base64.b64decode(encoded).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        policy = self._policies_now().get(user)
        if policy is None or policy.token != token:
            return None
        return user

    def _refuse(self, flow: http.HTTPFlow, status: int, reason: str) -> None:
        headers = {"Content-Type": "text/plain"}
        if status == 407:
            headers["Proxy-Authenticate"] = 'Basic realm="baseline-egress"'
        flow.response = http.Response.make(
            status, f"refused by the workspace egress policy: {reason}\n".encode(), headers
        )

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        workspace = self._authenticate(flow)
        target = f"{flow.request.host}:{flow.request.port}"
        if workspace is None:
            self._write("", "CONNECT", target, rules.Decision(False, _UNAUTHENTICATED))
            self._refuse(flow, 407, _UNAUTHENTICATED)
            return
        self._identities[flow.client_conn.id] = workspace
        refused: str | None = "policy: none"
        extra: dict[str, Any] = {}
        if self._policies_now()[workspace].mode != "none":  # authenticated: it is there
            refused, extra = await self._refusal(flow.request.host, flow.request.port)
        if refused:
            self._write(workspace, "CONNECT", target, rules.Decision(False, refused), **extra)
            self._refuse(flow, 403, refused)

    def _forbidden(self, host: str) -> str | None:
        """The rule that refuses a destination for every workspace, if any."""
        if rules.in_networks(host, ctx.options.egress_deny_networks):
            return str(rules.WORKSPACE_NETWORK_RULE)
        if not ctx.options.egress_allow_private and rules.is_private_destination(host):
            return str(rules.PRIVATE_RULE)
        return None

    async def _resolved(self, host: str, port: int) -> list[str]:
        """The addresses `host` resolves to, when some could be refused; [] when the name does
        not resolve (mitmproxy reports that itself). Off the event loop: a slow resolver must not
        stall every other workspace's traffic."""
        if ctx.options.egress_allow_private and not ctx.options.egress_deny_networks:
            return []
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port)
        except (OSError, ValueError):  # ValueError: a name IDNA cannot encode (label too long)
            return []
        return sorted({str(info[4][0]) for info in infos})

    async def _refusal(self, host: str, port: int) -> tuple[str | None, dict[str, Any]]:
        """The rule that refuses `host:port` for every workspace, if any, and what to log with it:
        by the name or address as asked, else by what it resolves to (a public-looking name, or a
        numeric form such as 2130706433, can stand for a loopback or private address). Asked
        before a request or tunnel is logged, so that no refused one is logged allowed."""
        if refused := self._forbidden(host):
            return refused, {}
        resolved = await self._resolved(host, port)
        refused = next(filter(None, map(self._forbidden, resolved)), None)
        return refused, {"resolved": resolved} if refused else {}

    async def request(self, flow: http.HTTPFlow) -> None:
        workspace = self._identities.get(flow.client_conn.id) or self._authenticate(flow)
        url = flow.request.pretty_url
        policy = self._policies_now().get(workspace or "")
        if workspace is None or policy is None:
            self._write("", flow.request.method, url, rules.Decision(False, _UNAUTHENTICATED))
            self._refuse(flow, 407, _UNAUTHENTICATED)
            return
        flow.request.headers.pop("Proxy-Authorization", None)
        decision = policy.decide(url)
        extra: dict[str, Any] = {}
        if decision.allowed:
            refused, extra = await self._refusal(flow.request.host, flow.request.port)
            if refused:
                decision = rules.Decision(False, refused)
        self._write(workspace, flow.request.method, url, decision, **extra)
        if not decision.allowed:
            self._refuse(flow, 403, decision.rule or "refused")

    async def tcp_start(self, flow: tcp.TCPFlow) -> None:
        """A tunnel that is not HTTP(S): refused to any host a rule of the workspace names, and
        like any destination (`_refusal`)."""
        workspace = self._identities.get(flow.client_conn.id, "")
        host, port = flow.server_conn.address or ("", 0)
        policy = self._policies_now().get(workspace)
        refused: str | None = "raw tunnel to a listed host"
        extra: dict[str, Any] = {}
        if policy is not None and not policy.blocks_host(host):
            refused, extra = await self._refusal(host, port)
        decision = rules.Decision(not refused, refused)
        self._write(workspace, "TCP", f"{host}:{port}", decision, **extra)
        if refused:
            flow.kill()

    async def server_connect(self, data: Any) -> None:
        """Last check, as the connection opens: the name may resolve to a refused address now
        though it did not when the request was decided (a resolver that answers differently)."""
        host, port = data.server.address
        resolved = await self._resolved(host, port)
        refused = next(filter(None, map(self._forbidden, resolved)), None)
        if refused:
            workspace = self._identities.get(data.client.id, "")
            decision = rules.Decision(False, refused)
            self._write(workspace, "CONNECT", f"{host}:{port}", decision, resolved=resolved)
            data.server.error = f"refused by the workspace egress policy: {refused}"

    def client_disconnected(self, client: Any) -> None:
        self._identities.pop(client.id, None)

    def done(self) -> None:
        if self._log is not None:
            self._log.close()


addons = [EgressFilter()]
