"""The isolation rules on their own (no Docker): which networks workspaces may join, what the
proxy refuses as a workspace network, and how a probe outcome reads."""

from __future__ import annotations

import pytest

from infra.egress.network import ICC_OPTION, NetworkIsolationError, gateway_of, isolation_problem
from infra.egress.rules import in_networks
from infra.isolation_probe import ProbeResult

BRIDGE = {
    "Driver": "bridge",
    "Internal": True,
    "Options": {ICC_OPTION: "false"},
    "IPAM": {"Config": [{"Subnet": "172.30.0.0/16", "Gateway": "172.30.0.1"}]},
}


def test_only_isolated_bridges_of_the_wanted_kind_are_accepted() -> None:
    assert isolation_problem("n", BRIDGE, internal=True) is None
    assert isolation_problem("n", BRIDGE, internal=None) is None
    legacy = {**BRIDGE, "Options": {}}
    problem = isolation_problem("n", legacy, internal=True)
    assert problem and "reach each other" in problem and "baseline host check" in problem
    enabled = {**BRIDGE, "Options": {ICC_OPTION: "true"}}
    assert isolation_problem("n", enabled, internal=True)
    assert "not routed" in str(isolation_problem("n", BRIDGE, internal=False))
    assert "not a bridge" in str(
        isolation_problem("n", {**BRIDGE, "Driver": "overlay"}, internal=None)
    )
    assert gateway_of("n", BRIDGE) == "172.30.0.1"
    with pytest.raises(NetworkIsolationError, match="no gateway"):
        gateway_of("n", {**BRIDGE, "IPAM": {"Config": []}})


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        ("172.30.0.5", True),
        ("172.30.255.254", True),
        ("[172.30.0.5]", True),
        ("10.9.0.3", True),
        ("172.31.0.5", False),
        ("127.0.0.1", False),
        ("workspace-name", False),  # names are checked after resolution, by address
        ("::1", False),
    ],
)
def test_workspace_networks_are_refused_by_address(host: str, refused: bool) -> None:
    assert in_networks(host, "172.30.0.0/16, 10.9.0.0/24") is refused
    assert in_networks(host, "") is False


def test_a_probe_reads_isolated_unless_a_connection_opened() -> None:
    dropped = ProbeResult("n", {"172.30.0.2": "timeout", "a": "unresolved"})
    assert dropped.isolated and dropped.problem is None
    reached = ProbeResult("n", {"172.30.0.2": "connected", "a": "timeout"})
    assert not reached.isolated
    assert reached.problem and "172.30.0.2" in reached.problem and "br_netfilter" in reached.problem
    assert not ProbeResult("n", {}).isolated  # nothing tried proves nothing
