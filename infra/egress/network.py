"""The Docker network of filtered workspaces: internal (no route out), the proxy on its gateway.

A container on an internal bridge network reaches nothing but the host's address on that bridge
(measured: the gateway answers, 1.1.1.1 has no route), so the proxy listening there is its only
way out: direct connections cannot bypass the filter.
"""

from __future__ import annotations

from collections.abc import Mapping

import docker
from docker.errors import NotFound


def ensure_network(
    client: docker.DockerClient, name: str, labels: Mapping[str, str] | None = None
) -> str:
    """Create the internal bridge network unless it exists; return its gateway address."""
    try:
        network = client.networks.get(name)
    except NotFound:
        network = client.networks.create(
            name, driver="bridge", internal=True, labels=dict(labels or {})
        )
        network.reload()
    if not network.attrs.get("Internal"):
        raise ValueError(
            f"network {name} exists but is not internal: egress could bypass the proxy"
        )
    configs = network.attrs.get("IPAM", {}).get("Config") or []
    gateways = [config["Gateway"] for config in configs if config.get("Gateway")]
    if not gateways:
        raise ValueError(f"network {name} has no gateway address for the proxy to listen on")
    return str(gateways[0])
