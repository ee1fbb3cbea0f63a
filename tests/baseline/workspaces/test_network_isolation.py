"""`baseline host check` makes a host's workspace networks isolated and proves it with a probe
pair, on the real Docker Engine (locally and over ssh://): networks made before isolation are
migrated when nothing is attached, refused with a clear message when something is, and a host
that does not drop traffic between containers is reported unhealthy.

The project networks are replaced by test-labelled ones (`networks` fixture), so the real
`baseline-egress` of the shared engine is never touched; so is the retired `baseline-open`.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from click.testing import CliRunner

from baseline.cli import cli
from baseline.context import Context
from baseline.workspaces import egress_gateway, network_isolation
from baseline.workspaces.egress_gateway import EgressGateway
from baseline.workspaces.network_isolation import ProjectNetwork
from infra import isolation_probe
from infra.docker_backend import WORKSPACE_LABEL
from infra.egress import firewall
from infra.egress.engine_host import firewall_for
from infra.egress.network import ICC_OPTION, subnets_of
from infra.egress.proxy import EgressProxyError, find_mitmdump
from tests.docker_env import (
    LOCAL_URL,
    RUN_ID,
    TEST_LABELS,
    docker_url,
    new_name,
    test_image,
    unavailable,
)
from tests.infra.test_egress_firewall import iptables_or_unavailable

pytestmark = pytest.mark.docker
__all__ = ["test_image"]


@pytest.fixture
def client() -> Iterator[docker.DockerClient]:
    made = docker.DockerClient(base_url=docker_url("unix"), use_ssh_client=False)
    yield made
    made.close()


@pytest.fixture
def networks(client: docker.DockerClient) -> Iterator[list[ProjectNetwork]]:
    """Test stand-ins for the egress network (internal) and a routed bridge; removed after."""
    made = [
        ProjectNetwork(new_name("bl-test-egress"), TEST_LABELS, internal=True),
        ProjectNetwork(new_name("bl-test-open"), TEST_LABELS, internal=False),
    ]
    yield made
    for network in made:
        for found in client.networks.list(names=[network.name]):
            found.remove()


def _legacy(client: docker.DockerClient, network: ProjectNetwork) -> dict[str, object]:
    """The network as it was made before isolation: Docker's default, icc on."""
    made = client.networks.create(
        network.name, driver="bridge", internal=network.internal, labels=dict(network.labels)
    )
    made.reload()
    return dict(made.attrs)


@pytest.mark.sshd
@pytest.mark.parametrize("kind", ["unix", "ssh"])
def test_check_creates_isolated_networks_and_the_probe_pair_passes(
    kind: str, networks: list[ProjectNetwork], client: docker.DockerClient, test_image: str
) -> None:
    url = docker_url(kind)
    report = network_isolation.check(url, networks, probe_labels=TEST_LABELS, retired=())
    assert report.problems == []
    assert report.notes == [f"created network {n.name} (isolated)" for n in networks]
    for network in networks:
        attrs = client.networks.get(network.name).attrs
        assert attrs["Options"][ICC_OPTION] == "false"
        assert attrs["Internal"] is network.internal
    again = network_isolation.check(url, networks, probe_labels=TEST_LABELS, retired=())
    assert (again.notes, again.problems) == ([], [])
    probes = ["baseline.component=isolation-probe", f"baseline.test-run={RUN_ID}"]
    assert client.containers.list(all=True, filters={"label": probes}) == []  # removed again


def test_the_probe_detects_a_network_that_lets_containers_talk(
    networks: list[ProjectNetwork], client: docker.DockerClient, test_image: str
) -> None:
    legacy = networks[0]
    _legacy(client, legacy)
    result = isolation_probe.probe(client, legacy.name, labels=TEST_LABELS)
    assert set(result.outcomes.values()) == {"connected"}, result  # by IP and by name
    assert not result.isolated
    assert result.problem and "does not isolate workspaces" in result.problem


def test_an_unused_legacy_network_is_migrated_keeping_its_subnet(
    networks: list[ProjectNetwork], client: docker.DockerClient, test_image: str
) -> None:
    legacy = networks[0]
    before = _legacy(client, legacy)
    report = network_isolation.check(LOCAL_URL, [legacy], probe_labels=TEST_LABELS, retired=())
    assert report.problems == []
    assert report.notes[0].startswith(f"migrated network {legacy.name}")
    after = client.networks.get(legacy.name).attrs
    assert after["Id"] != before["Id"]
    assert after["Options"][ICC_OPTION] == "false" and after["Internal"] is True
    assert subnets_of(after) == subnets_of(before)
    assert after["IPAM"]["Config"][0]["Gateway"] == before["IPAM"]["Config"][0]["Gateway"]  # type: ignore[index]
    assert after["Labels"] == TEST_LABELS


def test_host_check_refuses_a_legacy_network_in_use_then_migrates_it(
    networks: list[ProjectNetwork],
    client: docker.DockerClient,
    test_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    legacy = networks[0]
    _legacy(client, legacy)
    monkeypatch.setattr(network_isolation, "PROJECT_NETWORKS", (legacy,))
    monkeypatch.setenv("BASELINE_HOME", str(tmp_path))
    monkeypatch.setenv("BASELINE_DEPLOYMENT", f"test-cli-{tmp_path.name}")
    monkeypatch.delenv("BASELINE_DATABASE_URL", raising=False)
    runner = CliRunner()
    assert runner.invoke(cli, ["init"]).exit_code == 0
    user = client.containers.run(
        test_image,
        ["sleep", "300"],
        name=new_name("bl-test-user"),
        network=legacy.name,
        labels=TEST_LABELS,
        detach=True,
    )
    try:
        added = runner.invoke(cli, ["host", "add", "here", LOCAL_URL])
        assert added.exit_code == 0, added.output
        assert "UNHEALTHY" in added.output
        checked = runner.invoke(cli, ["host", "check", "here"])
        assert checked.exit_code == 1
        assert (
            f"here: UNHEALTHY: network {legacy.name} lets its containers reach each other "
            f"({ICC_OPTION} is not false) and cannot be migrated while containers are "
            f"attached: {user.name}; stop and remove them"
        ) in checked.output
        assert "1 host(s) unhealthy" in checked.output
        assert client.networks.get(legacy.name).attrs["Options"].get(ICC_OPTION) is None
        user.stop(timeout=1)  # stopped, it would not start again on a recreated network
        stopped = runner.invoke(cli, ["host", "check", "here"])
        assert stopped.exit_code == 1 and f"attached: {user.name}" in stopped.output
    finally:
        user.remove(force=True)
    fixed = runner.invoke(cli, ["host", "check", "here"])
    assert fixed.exit_code == 0, fixed.output
    assert f"here: migrated network {legacy.name}" in fixed.output
    assert "here: healthy" in fixed.output


@pytest.fixture
def accept_between_containers(
    networks: list[ProjectNetwork], client: docker.DockerClient
) -> Iterator[ProjectNetwork]:
    """A host misconfigured for one isolated network: DOCKER-USER (which runs before Docker's
    own rules) accepts traffic between its containers, as a host without the drop would."""
    if shutil.which("iptables") is None:
        unavailable("iptables is not installed")
    network = networks[1]
    network_isolation.check(LOCAL_URL, [network], probe_labels=TEST_LABELS, retired=())
    interface = firewall.bridge_of(client, network.name).interface
    rule = ["DOCKER-USER", "-i", interface, "-o", interface, "-j", "ACCEPT"]
    inserted = subprocess.run(["iptables", "-w", "-I", *rule], capture_output=True, text=True)
    if inserted.returncode != 0:
        unavailable(f"iptables cannot be used here: {inserted.stderr.strip()}")
    try:
        yield network
    finally:
        subprocess.run(["iptables", "-w", "-D", *rule], check=True)


def test_a_host_that_does_not_drop_traffic_between_containers_is_reported(
    accept_between_containers: ProjectNetwork, test_image: str
) -> None:
    network = accept_between_containers
    report = network_isolation.check(LOCAL_URL, [network], probe_labels=TEST_LABELS, retired=())
    assert report.notes == []  # configured right: icc is off
    (problem,) = report.problems
    assert problem.startswith(f"network {network.name} does not isolate workspaces")
    assert "br_netfilter" in problem


def test_the_gateways_proxy_refuses_its_own_network_as_a_destination(
    ctx: Context, networks: list[ProjectNetwork], client: docker.DockerClient
) -> None:
    """Even where private addresses are allowed (tests), no workspace reaches another through the
    proxy: the gateway hands its network's subnet to the proxy as refused."""
    try:
        find_mitmdump()
    except EgressProxyError as exc:
        unavailable(str(exc))
    iptables_or_unavailable()
    network = networks[0]
    gateway = EgressGateway(
        egress_gateway.state_dir(ctx.settings),
        docker_url=LOCAL_URL,
        network=network.name,
        labels=TEST_LABELS,
        allow_private=True,
    )
    try:
        route = gateway.register("ws-probe", "open")
        (subnet,) = subnets_of(client.networks.get(network.name).attrs)
        inside = str(next(ipaddress.ip_network(subnet).hosts()) + 1)  # a workspace's address
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({"http": route.env["HTTP_PROXY"]})
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            opener.open(f"http://{inside}:8000/", timeout=20)
        assert refused.value.code == 403
        assert b"workspace network" in refused.value.read()
    finally:
        gateway.stop()
        firewall.remove(firewall.bridge_of(client, network.name).interface)


def test_the_retired_routed_bridge_is_removed_and_reported_while_containers_use_it(
    client: docker.DockerClient, test_image: str
) -> None:
    """A routed bridge an earlier version made (no host firewall: its containers reached the
    portal and the host's services) makes the host unhealthy while something uses it."""
    retired = new_name("bl-test-retired")
    client.networks.create(retired, driver="bridge", labels=TEST_LABELS)
    user = client.containers.run(
        test_image,
        ["sleep", "300"],
        name=new_name("bl-test-user"),
        network=retired,
        labels=TEST_LABELS,
        detach=True,
    )
    try:
        report = network_isolation.check(LOCAL_URL, [], retired=(retired,))
        (problem,) = report.problems
        assert problem.startswith(f"network {retired} (a routed bridge of an earlier version")
        assert f"still carries {user.name}: remove them" in problem
        assert client.networks.list(names=[retired])
    finally:
        user.remove(force=True)
    report = network_isolation.check(LOCAL_URL, [], retired=(retired,))
    assert report.problems == []
    assert report.notes == [f"removed network {retired} (a routed bridge of an earlier version)"]
    assert [n for n in client.networks.list(names=[retired]) if n.name == retired] == []


@pytest.mark.sshd
@pytest.mark.parametrize("kind", ["unix", "ssh"])
def test_workspaces_on_a_bridge_the_host_does_not_firewall_make_the_host_unhealthy(
    kind: str, networks: list[ProjectNetwork], client: docker.DockerClient, test_image: str
) -> None:
    iptables_or_unavailable()
    url = docker_url(kind)
    network = networks[0]
    assert (
        network_isolation.check(url, [network], probe_labels=TEST_LABELS, retired=()).problems == []
    )
    # Without workspaces on it (a new host) the bridge needs no rules yet.
    workspace = client.containers.run(
        test_image,
        ["sleep", "300"],
        name=new_name("bl-test-ws"),
        network=network.name,
        labels={**TEST_LABELS, WORKSPACE_LABEL: "ws-unguarded"},
        detach=True,
    )
    bridge = firewall.bridge_of(client, network.name)
    rules = firewall_for(url, client, TEST_LABELS)
    try:
        (problem,) = network_isolation.check(
            url, [network], probe_labels=TEST_LABELS, retired=()
        ).problems
        assert problem.startswith(
            f"network {network.name} carries 1 workspace(s) but the host does not firewall its "
            f"bridge {bridge.interface}"
        )
        rules.restrict_to_proxy(bridge, 3128)
        assert (
            network_isolation.check(url, [network], probe_labels=TEST_LABELS, retired=()).problems
            == []
        )
        # A chain left without its DROP (edited by hand) guards nothing.
        subprocess.run(["iptables", "-w", "-D", bridge.chain, "-j", "DROP"], check=True)
        (problem,) = network_isolation.check(
            url, [network], probe_labels=TEST_LABELS, retired=()
        ).problems
        assert "does not firewall" in problem
    finally:
        workspace.remove(force=True)
        rules.remove(bridge.interface)
