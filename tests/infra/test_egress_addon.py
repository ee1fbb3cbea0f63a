"""The egress addon's hooks, one at a time, in the proxy's own venv (mitmproxy is not in the
portal's): a harness runs them with mitmproxy's test context and a resolver that answers from a
table, so that a name can stand for any address, or change its answer between two lookups, with
no DNS. `tests/infra/test_egress.py` runs the same addon in the real mitmdump.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.egress.proxy import ADDON, EgressProxyError, find_mitmdump
from infra.egress.rules import WorkspacePolicy, dump_config
from tests.infra.test_local_backend import unavailable

# Run by the egress venv's Python. stdin: {"addon", "state" (a folder for the policy file and
# the log), "config", "options", "answers", "calls"};
# `answers` maps a name to the address lists of its successive lookups (the last one repeats);
# each call runs one hook for workspace "ws" (token "tok") on the client connection it names,
# whose identity a CONNECT remembers. stdout: each call's outcome (the response's status, or
# "killed", or the server connection's error, else null) and the events logged.
HARNESS = r"""
import asyncio, base64, importlib.util, inspect, json, os, socket, sys
from mitmproxy import connection
from mitmproxy.proxy import server_hooks
from mitmproxy.test import taddons, tflow

job = json.load(sys.stdin)
spec = importlib.util.spec_from_file_location("egress_addon", job["addon"])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
answers = {name: list(lists) for name, lists in job["answers"].items()}


def getaddrinfo(host, port, *args, **kwargs):
    if host not in answers:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    addresses = answers[host].pop(0) if len(answers[host]) > 1 else answers[host][0]
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in addresses]


socket.getaddrinfo = getaddrinfo  # asyncio's loop.getaddrinfo calls it too


async def run(hook, *args):
    if inspect.isawaitable(result := hook(*args)):
        await result


def authenticated(flow):
    token = base64.b64encode(b"ws:tok").decode()
    flow.request.headers["Proxy-Authorization"] = f"Basic {token}"
    return flow


async def main():
    state = job["state"]
    config, log = os.path.join(state, "policies.json"), os.path.join(state, "events.jsonl")
    with open(config, "w") as file:
        file.write(job["config"])
    addon = module.EgressFilter()
    clients, outcomes = {}, []
    with taddons.context(addon) as context:
        context.configure(addon, egress_config=config, egress_log=log, **job["options"])
        for call in job["calls"]:
            client = clients.setdefault(call["client"], tflow.tclient_conn())
            hook = call["hook"]
            if hook == "request":
                flow = authenticated(tflow.tflow(client_conn=client))
                flow.request.url = call["url"]
                await run(addon.request, flow)
                outcomes.append(flow.response.status_code if flow.response else None)
            elif hook == "http_connect":
                flow = authenticated(tflow.tflow(client_conn=client))
                flow.request.method = "CONNECT"
                flow.request.host, flow.request.port = call["host"], call["port"]
                await run(addon.http_connect, flow)
                outcomes.append(flow.response.status_code if flow.response else None)
            elif hook == "tcp_start":
                flow = tflow.ttcpflow(client_conn=client)
                flow.server_conn.address = (call["host"], call["port"])
                await run(addon.tcp_start, flow)
                outcomes.append("killed" if flow.error else None)
            else:
                server = connection.Server(address=(call["host"], call["port"]))
                data = server_hooks.ServerConnectionHookData(server, client)
                await run(addon.server_connect, data)
                outcomes.append(server.error)
        addon.done()
    with open(log) as file:
        events = [json.loads(line) for line in file]
    json.dump({"outcomes": outcomes, "events": events}, sys.stdout)


asyncio.run(main())
"""

LOOPBACK_AS_NUMBER = "2130706433"  # 127.0.0.1 to any resolver, no address to a name check
ANSWERS = {
    LOOPBACK_AS_NUMBER: [["127.0.0.1"]],
    "public.example": [["93.184.216.34"]],
    "intranet.example": [["10.9.0.5"]],  # in the workspace network of WORKSPACES below
    "rebinding.example": [["93.184.216.34"], ["127.0.0.1"]],  # public first, loopback next
}
WORKSPACES = {"egress_allow_private": True, "egress_deny_networks": "10.9.0.0/16"}


def run_hooks(
    state: Path,
    calls: list[dict[str, Any]],
    *,
    options: dict[str, Any] | None = None,
    mode: str = "open",
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The outcome of each call and the events logged, by the addon in the egress venv."""
    try:
        python = Path(find_mitmdump()).with_name("python")
    except EgressProxyError as exc:
        unavailable(str(exc))
    if not python.exists():
        unavailable(f"no python beside {find_mitmdump()}: the egress venv is incomplete")
    job = {
        "addon": str(ADDON),
        "state": str(state),
        "config": dump_config({"ws": WorkspacePolicy(mode=mode, token="tok")}),
        "options": options or {},
        "answers": ANSWERS,
        "calls": [{"client": "c1", **call} for call in calls],
    }
    done = subprocess.run(
        [str(python), "-c", HARNESS],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    return result["outcomes"], result["events"]


def summary(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(e["method"], e["url"], e["allowed"], e["rule"], e.get("resolved")) for e in events]


@pytest.mark.parametrize(
    ("calls", "outcome", "logged"),
    [
        (  # plain HTTP: the name resolves to loopback
            [{"hook": "request", "url": f"http://{LOOPBACK_AS_NUMBER}:8080/x"}],
            403,
            ("GET", f"http://{LOOPBACK_AS_NUMBER}:8080/x"),
        ),
        (  # HTTPS: the tunnel is refused before it opens
            [{"hook": "http_connect", "host": LOOPBACK_AS_NUMBER, "port": 443}],
            403,
            ("CONNECT", f"{LOOPBACK_AS_NUMBER}:443"),
        ),
        (  # a request in a tunnel whose name resolved to a public address at CONNECT
            [
                {"hook": "http_connect", "host": "rebinding.example", "port": 443},
                {"hook": "request", "url": "https://rebinding.example/x"},
            ],
            403,
            ("GET", "https://rebinding.example/x"),
        ),
        (  # a raw (non-HTTP) tunnel likewise
            [
                {"hook": "http_connect", "host": "rebinding.example", "port": 22},
                {"hook": "tcp_start", "host": "rebinding.example", "port": 22},
            ],
            "killed",
            ("TCP", "rebinding.example:22"),
        ),
    ],
)
def test_a_name_refused_after_resolution_is_logged_refused(
    calls: list[dict[str, Any]], outcome: object, logged: tuple[str, str], tmp_path: Path
) -> None:
    """The name passes the check by name; the address it resolves to does not. The request was
    logged allowed (and then refused at connect): every refusal must be logged as one."""
    outcomes, events = run_hooks(tmp_path, calls)
    assert outcomes[-1] == outcome
    assert summary(events) == [(*logged, False, "private address", ["127.0.0.1"])]
    assert {e["workspace"] for e in events} == {"ws"}


def test_a_name_of_a_workspace_network_address_is_logged_refused(tmp_path: Path) -> None:
    """The workspace networks are refused even where private addresses are let through."""
    calls: list[dict[str, Any]] = [
        {"hook": "request", "url": "http://intranet.example/x"},
        {"hook": "http_connect", "host": "intranet.example", "port": 443},
    ]
    outcomes, events = run_hooks(tmp_path, calls, options=WORKSPACES)
    assert outcomes == [403, 403]
    assert summary(events) == [
        ("GET", "http://intranet.example/x", False, "workspace network", ["10.9.0.5"]),
        ("CONNECT", "intranet.example:443", False, "workspace network", ["10.9.0.5"]),
    ]


def test_public_and_unresolvable_names_are_logged_allowed(tmp_path: Path) -> None:
    """A name that does not resolve is mitmproxy's to report (a 502): the policy allowed it."""
    calls: list[dict[str, Any]] = [
        {"hook": "http_connect", "host": "public.example", "port": 443},
        {"hook": "request", "url": "https://public.example/x"},
        {"hook": "request", "url": "http://no-such-name.example/x"},
        {"hook": "tcp_start", "host": "public.example", "port": 22},
    ]
    outcomes, events = run_hooks(tmp_path, calls)
    assert outcomes == [None, None, None, None]
    assert summary(events) == [
        ("GET", "https://public.example/x", True, None, None),
        ("GET", "http://no-such-name.example/x", True, None, None),
        ("TCP", "public.example:22", True, None, None),
    ]


def test_the_server_connection_is_checked_once_more(tmp_path: Path) -> None:
    """A name whose answer changes after the request was decided is still refused at connect,
    and logged refused for the workspace whose tunnel it is."""
    calls: list[dict[str, Any]] = [
        {"hook": "http_connect", "host": "rebinding.example", "port": 443},
        {"hook": "server_connect", "host": "rebinding.example", "port": 443},
    ]
    outcomes, events = run_hooks(tmp_path, calls)
    assert outcomes == [None, "refused by the workspace egress policy: private address"]
    assert summary(events) == [
        ("CONNECT", "rebinding.example:443", False, "private address", ["127.0.0.1"])
    ]
    assert events[0]["workspace"] == "ws"


def test_policy_none_refuses_every_tunnel(tmp_path: Path) -> None:
    outcomes, events = run_hooks(
        tmp_path, [{"hook": "http_connect", "host": "public.example", "port": 443}], mode="none"
    )
    assert outcomes == [403]
    assert summary(events) == [("CONNECT", "public.example:443", False, "policy: none", None)]
