"""Two deployments on one engine each have their own egress network, proxy and firewall chain:
on a shared bridge their proxies (each on its own port) rewrote the bridge's one chain to their own
port in turn, cutting the other's workspaces off their proxy."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from baseline.workspaces import egress_gateway
from baseline.workspaces.egress_gateway import EgressGateway
from infra.egress import firewall
from infra.egress.proxy import EgressProxyError, find_mitmdump
from tests.docker_env import LOCAL_URL, RUN_ID, TEST_LABELS, unavailable
from tests.infra.test_egress_firewall import iptables_or_unavailable


@pytest.mark.parametrize(
    ("deployment", "network"),
    [
        ("default", "baseline-egress"),
        ("lab-b", "baseline-egress-lab-b"),
        ("a b/c", "baseline-egress-a-b-c"),  # only characters a network name may hold
    ],
)
def test_each_deployment_has_its_own_egress_network(
    deployment: str, network: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BASELINE_DEPLOYMENT", deployment)
    assert egress_gateway.network_name() == network


@pytest.mark.docker
def test_two_deployments_on_one_engine_keep_both_proxies_reachable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        find_mitmdump()
    except EgressProxyError as exc:
        unavailable(str(exc))
    iptables_or_unavailable()
    gateways: list[EgressGateway] = []
    for name in ("a", "b"):
        monkeypatch.setenv("BASELINE_DEPLOYMENT", f"test-{RUN_ID}-{name}")
        gateways.append(
            EgressGateway(
                tmp_path / name,
                docker_url=LOCAL_URL,
                network=egress_gateway.network_name(),
                labels=TEST_LABELS,
            )
        )
    client = docker.DockerClient(base_url=LOCAL_URL, use_ssh_client=False)
    try:
        ports = [gateway.ensure_running()[1] for gateway in gateways]
        assert gateways[0].network != gateways[1].network
        for gateway, port in zip(gateways, ports, strict=True):
            bridge = firewall.bridge_of(client, gateway.network)
            assert firewall.guards(bridge)
            assert any(f"--dport {port} " in rule for rule in firewall.installed(bridge.chain))
    finally:
        for gateway in gateways:
            gateway.stop()
            for found in client.networks.list(names=[gateway.network]):
                if found.name == gateway.network:
                    firewall.remove(firewall.bridge_from(gateway.network, found.attrs).interface)
                    found.remove()
        client.close()
