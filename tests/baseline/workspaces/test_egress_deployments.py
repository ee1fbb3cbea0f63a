"""Deployments on one engine share its egress bridge, each proxy's rule owned by its deployment:
a chain holding one port only cut every other deployment's workspaces off their proxy each time
one deployment refreshed it (the two-owner firewall test is in tests/infra/test_egress_firewall)."""

from __future__ import annotations

from pathlib import Path

import pytest

from baseline.workspaces import egress_gateway
from baseline.workspaces.egress_gateway import EgressGateway


@pytest.mark.parametrize(
    ("deployment", "owner", "container"),
    [
        ("default", "default", "baseline-egress-proxy"),
        ("lab-b", "lab-b", "baseline-egress-proxy-lab-b"),
        ("a b/c", "a-b-c", "baseline-egress-proxy-a-b-c"),  # only what a comment may hold
    ],
)
def test_each_deployment_owns_its_proxy_rule_and_container_on_the_shared_bridge(
    deployment: str, owner: str, container: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BASELINE_DEPLOYMENT", deployment)
    assert egress_gateway.firewall_owner() == owner
    gateway = EgressGateway(tmp_path, docker_url="ssh://user@gpu-box")
    assert gateway.network == egress_gateway.NETWORK
    assert (gateway.owner, gateway.container_name) == (owner, container)
