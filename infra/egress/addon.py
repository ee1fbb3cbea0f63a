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
refused by name or address in the request, and again after name resolution, before connecting.
`egress_deny_networks` (comma-separated CIDRs: the workspace networks) are refused the same way
whatever `egress_allow_private` says, so that no workspace reaches another through the proxy.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import socket
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

    def http_connect(self, flow: http.HTTPFlow) -> None:
        workspace = self._authenticate(flow)
        target = f"{flow.request.host}:{flow.request.port}"
        if workspace is None:
            self._write("", "CONNECT", target, rules.Decision(False, _UNAUTHENTICATED))
            self._refuse(flow, 407, _UNAUTHENTICATED)
            return
        self._identities[flow.client_conn.id] = workspace
        if self._policies_now()[workspace].mode == "none":  # authenticated: it is there
            self._write(workspace, "CONNECT", target, rules.Decision(False, "policy: none"))
            self._refuse(flow, 403, "policy: none")
        elif refused := self._forbidden(flow.request.host):
            self._write(workspace, "CONNECT", target, rules.Decision(False, refused))
            self._refuse(flow, 403, refused)

    def _forbidden(self, host: str) -> str | None:
        """The rule that refuses a destination for every workspace, if any."""
        if rules.in_networks(host, ctx.options.egress_deny_networks):
            return str(rules.WORKSPACE_NETWORK_RULE)
        if not ctx.options.egress_allow_private and rules.is_private_destination(host):
            return str(rules.PRIVATE_RULE)
        return None

    def request(self, flow: http.HTTPFlow) -> None:
        workspace = self._identities.get(flow.client_conn.id) or self._authenticate(flow)
        url = flow.request.pretty_url
        policy = self._policies_now().get(workspace or "")
        if workspace is None or policy is None:
            self._write("", flow.request.method, url, rules.Decision(False, _UNAUTHENTICATED))
            self._refuse(flow, 407, _UNAUTHENTICATED)
            return
        flow.request.headers.pop("Proxy-Authorization", None)
        decision = policy.decide(url)
        if decision.allowed and (refused := self._forbidden(flow.request.host)):
            decision = rules.Decision(False, refused)
        self._write(workspace, flow.request.method, url, decision)
        if not decision.allowed:
            self._refuse(flow, 403, decision.rule or "refused")

    def tcp_start(self, flow: tcp.TCPFlow) -> None:
        """A tunnel that is not HTTP(S): refused to any host a rule of the workspace names."""
        workspace = self._identities.get(flow.client_conn.id, "")
        host, port = flow.server_conn.address or ("", 0)
        policy = self._policies_now().get(workspace)
        refused = policy is None or policy.blocks_host(host)
        decision = rules.Decision(not refused, "raw tunnel to a listed host" if refused else None)
        self._write(workspace, "TCP", f"{host}:{port}", decision)
        if refused:
            flow.kill()

    def server_connect(self, data: Any) -> None:
        """Last check, after resolution: a public name that resolves to a refused address."""
        if ctx.options.egress_allow_private and not ctx.options.egress_deny_networks:
            return
        host, port = data.server.address
        try:
            resolved = {info[4][0] for info in socket.getaddrinfo(host, port)}
        except OSError:
            return  # mitmproxy reports the failed resolution itself
        refused = next(filter(None, (self._forbidden(str(ip)) for ip in sorted(resolved))), None)
        if refused:
            workspace = self._identities.get(data.client.id, "")
            decision = rules.Decision(False, refused)
            self._write(workspace, "CONNECT", f"{host}:{port}", decision, resolved=sorted(resolved))
            data.server.error = f"refused by the workspace egress policy: {refused}"

    def client_disconnected(self, client: Any) -> None:
        self._identities.pop(client.id, None)

    def done(self) -> None:
        if self._log is not None:
            self._log.close()


addons = [EgressFilter()]
