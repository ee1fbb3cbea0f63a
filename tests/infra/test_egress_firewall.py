"""The egress network's host firewall, on the real dockerd and iptables.

Two HTTP servers on the host, bound to 0.0.0.0: one stands in for the proxy (port P), the other
for any host service (port A). From a container on the internal network both answer at the
gateway address until the rules are installed (the bypass); afterwards only P does, and after the
rules are removed A answers again. The same on the `ssh://` engine of the test sshd, the rules
installed through the Docker API alone (`EngineHostFirewall`: a helper container in dockerd's
namespaces); that engine is this machine's, so the host servers here are its host's services.
"""

from __future__ import annotations

import http.server
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from docker.models.containers import Container

from infra.egress import firewall
from infra.egress.engine_host import EngineHostFirewall, firewall_for, run_script
from infra.egress.network import ensure_network
from tests.docker_env import TEST_LABELS, docker_url, new_name, test_image, unavailable
from tests.ok_http import OkHandler

__all__ = ["test_image"]

# Inside the container: one line per port, "port ok" when an HTTP GET answered, else the error.
PROBE = """
import sys, urllib.request
host = sys.argv[1]
for port in sys.argv[2:]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/", timeout=2) as response:
            print(port, "ok" if response.read() == b"ok" else "wrong")
    except Exception as error:
        print(port, type(error).__name__)
"""


@pytest.fixture
def host_servers() -> Iterator[tuple[int, int]]:
    """(A, P): two HTTP servers on all of the host's addresses."""
    servers = [http.server.ThreadingHTTPServer(("0.0.0.0", 0), OkHandler) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield servers[0].server_address[1], servers[1].server_address[1]
    for server in servers:
        server.shutdown()
        server.server_close()


def iptables_or_unavailable() -> None:
    for tool in (firewall.IPTABLES, f"{firewall.IPTABLES}-restore"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed")
    listed = subprocess.run(["iptables", "-w", "-S", "INPUT"], capture_output=True, text=True)
    if listed.returncode != 0:
        unavailable(f"iptables cannot be used here: {listed.stderr.strip()}")


@dataclass
class Network:
    name: str
    subnet: str
    bridge: firewall.Bridge
    probe: Container
    rules: firewall.Firewall
    client: docker.DockerClient


@pytest.fixture(params=["unix", "ssh"])
def network(request: pytest.FixtureRequest, test_image: str) -> Iterator[Network]:
    """A labelled internal network with a container on it, on the local engine or over ssh://;
    rules, container, network removed."""
    iptables_or_unavailable()
    url = docker_url(request.param)
    client = docker.DockerClient(base_url=url, use_ssh_client=False, timeout=120)
    rules = firewall_for(url, client, TEST_LABELS)
    name = new_name("bl-test-fw")
    bridge: firewall.Bridge | None = None
    container = None
    try:
        ensure_network(client, name, TEST_LABELS)
        bridge = firewall.bridge_of(client, name)
        subnet = client.networks.get(name).attrs["IPAM"]["Config"][0]["Subnet"]
        container = client.containers.run(
            test_image,
            ["sleep", "600"],
            detach=True,
            network=name,
            labels=TEST_LABELS,
            name=new_name("bl-test-fw"),
        )
        yield Network(name, subnet, bridge, container, rules, client)
    finally:
        if bridge is not None:
            rules.remove(bridge.interface)
        if container is not None:
            container.remove(force=True)
        for found in client.networks.list(names=[name]):
            found.remove()
        client.close()


def probe(network: Network, *ports: int) -> dict[int, str]:
    result = network.probe.exec_run(
        ["python3", "-c", PROBE, network.bridge.gateway, *map(str, ports)]
    )
    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.output.decode().splitlines()]
    return {int(port): outcome for port, outcome in lines}


def input_jumps(network: Network) -> int:
    """The jumps to the bridge's chain in INPUT, read where the rules were installed."""
    if isinstance(network.rules, EngineHostFirewall):
        image = network.rules.image
        listed = run_script(network.client, '"$IPTABLES" -w -S INPUT', image=image)
    else:
        command = ["iptables", "-w", "-S", "INPUT"]
        listed = subprocess.run(command, capture_output=True, text=True).stdout
    return sum(line.endswith(f"-j {network.bridge.chain}") for line in listed.splitlines())


@pytest.mark.docker
def test_only_the_proxy_port_of_the_host_is_reachable(
    network: Network, host_servers: tuple[int, int]
) -> None:
    service, proxy = host_servers
    assert probe(network, service, proxy) == {service: "ok", proxy: "ok"}  # the bypass

    assert network.rules.restrict_to_proxy(network.bridge, proxy) is True
    assert network.rules.restrict_to_proxy(network.bridge, proxy) is False  # already in place
    assert len(network.rules.installed(network.bridge.chain)) == 3
    assert input_jumps(network) == 1
    outcome = probe(network, service, proxy)
    assert outcome[proxy] == "ok"
    assert outcome[service] != "ok", outcome

    # Docker itself keeps the internal bridge from forwarding anywhere off its subnet.
    drop_off_subnet = ["!", "-d", network.subnet, "-i", network.bridge.interface, "-j", "DROP"]
    isolation = subprocess.run(
        ["iptables", "-w", "-C", "DOCKER-ISOLATION-STAGE-1", *drop_off_subnet],
        capture_output=True,
        text=True,
    )
    assert isolation.returncode == 0, isolation.stderr

    # A new proxy port replaces the old one; the jump is not duplicated.
    assert network.rules.restrict_to_proxy(network.bridge, service) is True
    assert input_jumps(network) == 1
    outcome = probe(network, service, proxy)
    assert outcome[service] == "ok" and outcome[proxy] != "ok", outcome

    network.rules.remove(network.bridge.interface)
    assert network.rules.installed(network.bridge.chain) == []
    assert input_jumps(network) == 0
    assert probe(network, service, proxy) == {service: "ok", proxy: "ok"}
    network.rules.remove(network.bridge.interface)  # removing twice is harmless


@pytest.mark.docker
def test_two_deployments_on_one_bridge_keep_each_others_proxy_rule(
    network: Network, host_servers: tuple[int, int]
) -> None:
    """Each deployment's proxy has its own port on the shared bridge: installing or refreshing
    one deployment's rule keeps the other's; a port change replaces only the mover's."""
    second, first = host_servers
    assert network.rules.restrict_to_proxy(network.bridge, first, "deploy-a") is True
    assert network.rules.restrict_to_proxy(network.bridge, second, "deploy-b") is True
    assert network.rules.restrict_to_proxy(network.bridge, first, "deploy-a") is False
    assert network.rules.restrict_to_proxy(network.bridge, second, "deploy-b") is False
    assert probe(network, first, second) == {first: "ok", second: "ok"}
    listed = network.rules.installed(network.bridge.chain)
    assert len(listed) == 4 and listed[-1].endswith("-j DROP")
    unused = 9
    assert network.rules.restrict_to_proxy(network.bridge, unused, "deploy-b") is True
    outcome = probe(network, first, second)
    assert outcome[first] == "ok" and outcome[second] != "ok", outcome
    assert network.rules.guards(network.bridge)
    with pytest.raises(firewall.FirewallError, match="invalid firewall owner"):
        network.rules.restrict_to_proxy(network.bridge, first, 'x" -j ACCEPT')


def test_the_firewall_fits_the_engine() -> None:
    client = docker.DockerClient(base_url="unix:///nonexistent.sock", version="1.41")  # no call
    assert isinstance(firewall_for("ssh://user@gpu-box", client), EngineHostFirewall)
    assert isinstance(firewall_for("unix:///var/run/docker.sock", client), firewall.LocalFirewall)


def test_missing_or_refusing_iptables_is_a_clear_error(tmp_path: Path) -> None:
    bridge = firewall.Bridge(interface="br-000000000000", gateway="172.30.0.1")
    with pytest.raises(firewall.FirewallError, match="is not installed"):
        firewall.restrict_to_proxy(bridge, 3128, iptables=str(tmp_path / "iptables"))
    refusing = tmp_path / "refusing"
    refusing.write_text("#!/bin/sh\necho 'Permission denied (you must be root)' >&2\nexit 4\n")
    refusing.chmod(0o755)
    with pytest.raises(firewall.FirewallError, match="you must be root"):
        firewall.restrict_to_proxy(bridge, 3128, iptables=str(refusing))
    with pytest.raises(firewall.FirewallError, match="invalid proxy port"):
        firewall.restrict_to_proxy(bridge, 0)


def test_bridge_name_from_option_or_network_id() -> None:
    attrs = {
        "Id": "0123456789abcdef",
        "Driver": "bridge",
        "Options": {},
        "IPAM": {"Config": [{"Subnet": "172.30.0.0/16", "Gateway": "172.30.0.1"}]},
    }
    assert firewall.bridge_from("n", attrs) == firewall.Bridge("br-0123456789ab", "172.30.0.1")
    assert firewall.bridge_from("n", attrs).chain == "BL-EGRESS-br-0123456789ab"
    named = {**attrs, "Options": {firewall.BRIDGE_NAME_OPTION: "egress0"}}
    assert firewall.bridge_from("n", named).interface == "egress0"
    with pytest.raises(firewall.FirewallError, match="not a bridge"):
        firewall.bridge_from("n", {**attrs, "Driver": "overlay"})
    with pytest.raises(firewall.FirewallError, match="no gateway"):
        firewall.bridge_from("n", {**attrs, "IPAM": {"Config": []}})
