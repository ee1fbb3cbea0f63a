"""Workspaces of different attempts cannot reach each other, on the real Docker Engine, locally
and over ssh://, in every egress mode; each workspace's own egress still is what its mode says.

Modes: `none` (no network), `open` and `blacklist` (the internal egress network, the real proxy on
its gateway with the mode's policy, the host firewalled to the proxy's port; there is no routed
network without the proxy: `test_there_is_no_routed_network`). In each: workspace A serves HTTP on
port 8000, workspace B of another attempt tries A by IP and by container name, directly and through
the proxy, and fails; the host (where the JupyterHub proxy runs) still reaches A's port. Over ssh://
everything goes through the ssh transport as for a remote host: the proxy is the container proxy on
that engine (`ContainerProxy`, its events pulled back here) and the firewall is installed by the
helper container (`EngineHostFirewall`); the test sshd's engine is this machine's, which is why the
test's own server on this host is the remote host's too.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import pytest

from infra import isolation_probe
from infra.docker_backend import NO_DNS, DockerBackend
from infra.egress import firewall, setup
from infra.egress.container_proxy import ContainerProxy
from infra.egress.engine_host import firewall_for
from infra.egress.network import ICC_OPTION, ensure_network, subnets_of
from infra.egress.proxy import EgressProxy, EgressProxyError, find_mitmdump
from infra.workspace import HardwareProfile, WorkspaceError, WorkspaceHandle, WorkspaceSpec
from tests.docker_env import TEST_LABELS, backend, docker_url, new_name, test_image, unavailable
from tests.infra.test_egress_firewall import iptables_or_unavailable
from tests.ok_http import OkHandler

pytestmark = [pytest.mark.docker, pytest.mark.slow]
__all__ = ["backend", "test_image"]

PORT = 8000
SMALL = HardwareProfile(name="cpu", cpus=1, memory_mb=512)

# Inside a workspace: one JSON object, url -> HTTP status or the error's class name. `proxy`:
# through the environment's proxy (as every tool in a proxied workspace does), else directly.
FETCH = """
import json, sys, urllib.request, urllib.error
direct = sys.argv[1] == "direct"
opener = urllib.request.build_opener(
    *([urllib.request.ProxyHandler({})] if direct else [])
)
outcomes = {}
for url in sys.argv[2:]:
    try:
        with opener.open(url, timeout=5) as response:
            outcomes[url] = response.status
    except urllib.error.HTTPError as error:
        outcomes[url] = error.code
    except Exception as error:
        reason = getattr(error, "reason", error)
        outcomes[url] = type(reason).__name__
print(json.dumps(outcomes))
"""


@pytest.fixture(scope="module")
def host_server() -> Iterator[int]:
    """An HTTP server on all of this host's addresses: the study's allowed outside target."""
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), OkHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@dataclass
class Egress:
    """The internal egress network of one engine, the proxy on its gateway, the host firewalled."""

    network: str
    gateway: str
    subnet: str
    proxy: EgressProxy


@dataclass
class Engines:
    """Per engine URL, made on first use and removed at the end of the module."""

    tmp: Path
    egress: dict[str, Egress] = field(default_factory=dict)
    cleanup: list[object] = field(default_factory=list)

    def egress_for(self, url: str) -> Egress:
        if url in self.egress:
            return self.egress[url]
        iptables_or_unavailable()
        try:
            find_mitmdump()
        except EgressProxyError as exc:
            unavailable(str(exc))
        client = docker.DockerClient(base_url=url, use_ssh_client=False, timeout=120)
        name = new_name("bl-test-iso")
        gateway = ensure_network(client, name, TEST_LABELS)
        attrs = client.networks.get(name).attrs
        bridge = firewall.bridge_from(name, attrs)
        rules = firewall_for(url, client, TEST_LABELS)

        def remove_network() -> None:
            rules.remove(bridge.interface)
            client.networks.get(name).remove()
            client.close()

        self.cleanup.append(remove_network)
        (subnet,) = subnets_of(attrs)
        # allow_private: the allowed target is this host's own server.
        if url.startswith("unix://"):
            proxy = EgressProxy(
                self.tmp / name, listen_host=gateway, allow_private=True, deny_networks=[subnet]
            )
        else:
            proxy = ContainerProxy(
                self.tmp / name,
                client,
                name=f"{name}-proxy",
                labels=TEST_LABELS,
                listen_host=gateway,
                allow_private=True,
                deny_networks=[subnet],
            )
        proxy.start()
        self.cleanup.append(proxy.stop)
        assert rules.restrict_to_proxy(bridge, proxy.port) is True
        assert len(rules.installed(bridge.chain)) == 3
        self.egress[url] = Egress(name, gateway, subnet, proxy)
        return self.egress[url]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    made = Engines(tmp_path_factory.mktemp("isolation"))
    yield made
    for step in reversed(made.cleanup):
        step()  # type: ignore[operator]


def _run(backend: DockerBackend, handle: WorkspaceHandle, *argv: str) -> str:
    result = backend.exec(handle, list(argv), timeout_s=60)
    assert result.exit_code == 0, result.output
    return result.output.decode()


def _address(backend: DockerBackend, handle: WorkspaceHandle) -> str:
    container = backend.client.containers.get(handle.name)
    networks = container.attrs["NetworkSettings"]["Networks"]
    return "".join(str(settings.get("IPAddress") or "") for settings in networks.values())


def _serve(backend: DockerBackend, handle: WorkspaceHandle) -> None:
    """A listens on 0.0.0.0:PORT (as the participant) and is seen listening from inside."""
    _run(
        backend,
        handle,
        "sh",
        "-c",
        f"nohup python3 -m http.server {PORT} --bind 0.0.0.0 >/dev/null 2>&1 &",
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        check = ["python3", "-c", isolation_probe.SELF_CHECK, str(PORT)]
        if backend.exec(handle, check, timeout_s=10).exit_code == 0:
            return
        time.sleep(0.3)
    pytest.fail(f"workspace {handle.name} did not listen on {PORT}")


def _fetch(
    backend: DockerBackend, handle: WorkspaceHandle, how: str, *urls: str
) -> dict[str, object]:
    return dict(json.loads(_run(backend, handle, "python3", "-c", FETCH, how, *urls)))


def _connect(backend: DockerBackend, handle: WorkspaceHandle, *targets: str) -> dict[str, str]:
    """B's raw TCP outcome per target (the probe's own client: connected/timeout/...)."""
    argv = ["python3", "-c", isolation_probe.CONNECT, str(PORT), "3", *targets]
    return dict(json.loads(_run(backend, handle, *argv).strip().splitlines()[-1]))


@pytest.mark.parametrize("mode", ["none", "open", "blacklist"])
def test_workspaces_of_other_attempts_cannot_reach_each_other(
    mode: str, backend: DockerBackend, engines: Engines, host_server: int, test_image: str
) -> None:
    kind = "unix" if backend.local else "ssh"
    env: dict[str, dict[str, str]] = {"a": {}, "b": {}}
    network = "none"
    egress = engines.egress_for(docker_url(kind)) if mode in ("open", "blacklist") else None
    names = {"a": new_name("bl-test-iso"), "b": new_name("bl-test-iso")}
    blocked = f"http://127.0.0.1:{host_server}/blocked"
    if egress is not None:
        network = egress.network
        for key in ("a", "b"):
            credentials = egress.proxy.register(names[key], mode, blocked)
            env[key] = setup.environment(credentials.url(egress.gateway, egress.proxy.port))
            env[key].update(NO_PROXY="", no_proxy="")  # the allowed target is 127.0.0.1
    handles: list[WorkspaceHandle] = []
    try:
        for attempt, key in enumerate(("a", "b"), start=1):
            spec = WorkspaceSpec(
                name=names[key],
                image=test_image,
                profile=SMALL,
                network=network,
                env=env[key],
                labels={"baseline.attempt": str(attempt)},
            )
            handles.append(backend.create(spec))
            backend.start(handles[-1])
        a, b = handles
        if egress is not None:
            setup.install(backend, a, egress.proxy.ca_path.read_bytes())
        _serve(backend, a)
        address = _address(backend, a)

        if mode == "none":
            assert address == ""  # no interface but loopback: nothing to connect to
            assert _connect(backend, b, a.name) == {a.name: "unresolved"}
            # No route at all, so no query can leave: no outside name resolves either.
            assert len(_run(backend, a, "cat", "/proc/net/route").strip().splitlines()) == 1
            lookup = _run(backend, a, "python3", "-c", LOOKUP, "outside-name.example")
            assert lookup.startswith("unresolved"), lookup
        else:
            # B cannot open a TCP connection to A, by IP or by name: dropped, not refused.
            outcome = _connect(backend, b, address, a.name)
            assert outcome[address] == "timeout", outcome
            assert outcome[a.name] in ("timeout", "unresolved"), outcome
            attrs = backend.client.networks.get(_network_of(backend, a)).attrs
            assert attrs["Options"][ICC_OPTION] == "false"
            # Nor by HTTP, directly (bypassing any proxy).
            direct = _fetch(backend, b, "direct", f"http://{address}:{PORT}/")
            assert direct[f"http://{address}:{PORT}/"] != 200, direct
            # The host (where the JupyterHub proxy runs) still reaches A's port.
            no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with no_proxy.open(f"http://{address}:{PORT}/", timeout=10) as answer:
                assert answer.status == 200

        allowed = f"http://127.0.0.1:{host_server}/allowed"
        if egress is not None:
            # Through the proxy B cannot reach A either: the workspace network is refused.
            via_proxy = _fetch(backend, b, "proxy", f"http://{address}:{PORT}/")
            assert via_proxy == {f"http://{address}:{PORT}/": 403}, via_proxy
            # A's own egress: through the proxy as its mode says, never around it.
            mine = _fetch(backend, a, "proxy", allowed, blocked)
            assert mine == {allowed: 200, blocked: 200 if mode == "open" else 403}, mine
            # Every request is logged, by the proxy on the workspace's host (pulled back here).
            # The proxy writes an exchange's event after answering it, so the fetch can be back
            # before the event is in the log: pulled until both are in (CI once pulled an
            # instant too early over SSH and found none).
            expected = [(allowed, True), (blocked, mode == "open")]
            deadline = time.monotonic() + 30
            while True:
                egress.proxy.pull_events()
                lines = egress.proxy.log_path.read_text().splitlines()
                logged = [json.loads(line) for line in lines]
                mine_logged = [(e["url"], e["allowed"]) for e in logged if e["workspace"] == a.name]
                if mine_logged[-2:] == expected or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert mine_logged[-2:] == expected, mine_logged
            around = f"http://{egress.gateway}:{host_server}/allowed"
            assert _fetch(backend, a, "direct", around)[around] != 200
            # No outside names: the embedded DNS forwards them only to the workspace itself.
            container = backend.client.containers.get(a.name)
            assert container.attrs["HostConfig"]["Dns"] == [NO_DNS]
        else:
            around = f"http://172.17.0.1:{host_server}/allowed"
            assert _fetch(backend, a, "direct", around)[around] != 200  # none: no way out
    finally:
        for handle in handles:
            backend.destroy(handle)
        if egress is not None:
            for name in names.values():
                egress.proxy.unregister(name)


def _network_of(backend: DockerBackend, handle: WorkspaceHandle) -> str:
    container = backend.client.containers.get(handle.name)
    (name,) = container.attrs["NetworkSettings"]["Networks"]
    return str(name)


def test_there_is_no_routed_network(backend: DockerBackend, test_image: str) -> None:
    """The routed `open` bridge reached the host's services: a workspace cannot ask for it."""
    name = new_name("bl-test-iso")
    spec = WorkspaceSpec(name=name, image=test_image, profile=SMALL, network="open")
    with pytest.raises(WorkspaceError, match="network 'open' does not exist"):
        backend.create(spec)
    assert backend.client.containers.list(all=True, filters={"name": spec.name}) == []


# Inside the workspace, as root: a DNS server on the workspace's own 127.0.0.1:53 that records
# each query's name and answers REFUSED at once.
RECORDER = """
import socket
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.bind(("127.0.0.1", 53))
while True:
    query, peer = sock.recvfrom(512)
    labels, i = [], 12
    while query[i]:
        labels.append(query[i + 1 : i + 1 + query[i]].decode())
        i += 1 + query[i]
    with open("/tmp/dns-queries", "a") as log:
        log.write(".".join(labels) + "\\n")
    sock.sendto(query[:2] + bytes([query[2] | 0x80, (query[3] & 0xF0) | 5]) + query[4:], peer)
"""
LOOKUP = """
import socket, sys
try:
    print(socket.gethostbyname(sys.argv[1]))
except OSError as error:
    print("unresolved", type(error).__name__)
"""


def test_a_workspace_on_an_internal_network_resolves_no_outside_name(
    backend: DockerBackend, engines: Engines, test_image: str
) -> None:
    """Docker's embedded DNS forwards unknown names to its upstream servers, by default the host's
    resolvers, even on an internal network. A workspace's only upstream is its own loopback: the
    configuration says so first (nothing is looked up unless it does, so no query can leave this
    machine), then a recorder on that loopback sees the query, which is refused."""
    kind = "unix" if backend.local else "ssh"
    egress = engines.egress_for(docker_url(kind))
    handle = backend.create(
        WorkspaceSpec(
            name=new_name("bl-test-dns"), image=test_image, profile=SMALL, network=egress.network
        )
    )
    try:
        backend.start(handle)
        container = backend.client.containers.get(handle.name)
        assert container.attrs["HostConfig"]["Dns"] == [NO_DNS]
        resolv = _run(backend, handle, "cat", "/etc/resolv.conf")
        assert "nameserver 127.0.0.11" in resolv  # Docker's embedded DNS: own names only
        started = backend.exec(
            handle,
            ["sh", "-c", f"nohup python3 -c '{RECORDER}' >/tmp/recorder.log 2>&1 &"],
            user="root",
            timeout_s=30,
        )
        assert started.exit_code == 0, started.output
        time.sleep(1)
        outside = "outside-name.example"
        assert _run(backend, handle, "python3", "-c", LOOKUP, outside).startswith("unresolved")
        seen = _run(backend, handle, "cat", "/tmp/dns-queries").split()
        assert outside in seen, seen  # forwarded to the workspace's own loopback, nowhere else
        own = _run(backend, handle, "python3", "-c", LOOKUP, handle.name).strip()
        assert own == _address(backend, handle)  # the network's own names still resolve
    finally:
        backend.destroy(handle)
