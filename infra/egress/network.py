"""The Docker network of filtered workspaces: internal (no route out), the proxy on its gateway.

An internal bridge network forwards nothing off the bridge (measured: 1.1.1.1 has no route, and
Docker's DOCKER-ISOLATION rules drop what the bridge would forward elsewhere). It does NOT shield
the host itself: packets to any of the host's addresses are delivered locally, so a service bound
to 0.0.0.0 or to the gateway address answers a container directly (measured on dockerd 20.10).
The network alone therefore does not make the proxy the only way out; `infra.egress.firewall`
restricts what the host accepts from the bridge to the proxy's port, and must be installed too.
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
