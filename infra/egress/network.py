"""Docker networks of workspaces: project-owned bridges whose containers cannot reach each other.

The egress network carries workspaces (internal: no route out), the proxy on its gateway; `open`
and `blacklist` studies use it. An internal bridge forwards nothing off the bridge (measured:
1.1.1.1 has no route, and Docker's DOCKER-ISOLATION rules drop what the bridge would forward
elsewhere). It does NOT shield the host itself: packets to any of the host's addresses are
delivered locally, so a service bound to 0.0.0.0 or to the gateway address answers a container
directly (measured on dockerd 20.10). `infra.egress.firewall` restricts what the host accepts from
the bridge to the proxy's port, and must be installed too. (A routed `open` bridge existed before;
it had no such firewall, reached the portal, the host's services and 169.254.169.254, and was
removed: `baseline host check` removes one an earlier version left.)

Isolation between workspaces: every such bridge is created with inter-container communication
off (`com.docker.network.bridge.enable_icc=false`): dockerd then adds `FORWARD -i br -o br -j DROP`
on the engine's own host, so any packet from one container to another on the same bridge is
dropped, by IP or by name (the embedded DNS still answers names; the connection never opens).
Chosen over a network per attempt because:

- it holds on `ssh://` hosts without any host access of ours: Docker writes the rule where the
  engine runs, where our iptables (`infra.egress.firewall`) cannot reach;
- the proxy keeps one listening address per engine (a network per attempt needs one gateway, one
  proxy address and one firewall chain per attempt), and a workspace's stored proxy URL stays
  valid across restarts;
- it does not exhaust Docker's address pools (31 networks by default) with 100+ workspaces;
- traffic between the host and a container does not cross FORWARD, so the host still reaches a
  workspace's ports (the JupyterHub proxy on the host talks to each single-user server) and
  workspaces still reach the egress proxy on the gateway.

It relies on bridged traffic passing through iptables (`br_netfilter`,
`net.bridge.bridge-nf-call-iptables=1`, which dockerd turns on when icc is off); a host where it
does not is caught by `infra.isolation_probe`, which `baseline host check` runs.

A network made before this change (same name, icc on) is not used: `ensure_network` refuses it,
and `migrate_network` (run by `baseline host check`) recreates it with icc off and the same
subnet and gateway (so the proxy's address and workspaces' proxy URLs stay valid) when no
container is attached, or refuses, naming the containers to remove first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import docker
from docker.errors import APIError, NotFound

ICC_OPTION = "com.docker.network.bridge.enable_icc"
ISOLATED_OPTIONS = {ICC_OPTION: "false"}


class NetworkIsolationError(ValueError):
    """A network would let workspaces reach each other, or cannot be made not to."""


def kind_problem(name: str, attrs: Mapping[str, Any], *, internal: bool | None) -> str | None:
    """Why the network is not the wanted kind of bridge (`internal` None: either kind)."""
    if attrs.get("Driver") != "bridge":
        return f"network {name} is not a bridge network ({attrs.get('Driver')})"
    if internal is not None and bool(attrs.get("Internal")) != internal:
        want = "internal" if internal else "routed (not internal)"
        return f"network {name} exists but is not {want}: egress would not be what the study says"
    return None


def icc_enabled(attrs: Mapping[str, Any]) -> bool:
    """Whether containers on the bridge may reach each other (Docker's default: yes)."""
    options = attrs.get("Options") or {}
    return str(options.get(ICC_OPTION, "true")).lower() != "false"


def isolation_problem(name: str, attrs: Mapping[str, Any], *, internal: bool | None) -> str | None:
    """Why workspaces must not join this network (None: they may)."""
    problem = kind_problem(name, attrs, internal=internal)
    if problem is None and icc_enabled(attrs):
        problem = (
            f"network {name} lets its containers reach each other ({ICC_OPTION} is not false); "
            "it was made before workspaces were isolated: run `baseline host check` to migrate it"
        )
    return problem


def ensure_network(
    client: docker.DockerClient,
    name: str,
    labels: Mapping[str, str] | None = None,
    *,
    internal: bool = True,
) -> str:
    """Create the isolated bridge network unless it exists; return its gateway address.

    An existing network that is not isolated (or not of the wanted kind) is refused.
    """
    try:
        network = client.networks.get(name)
    except NotFound:
        network = _create(client, name, internal=internal, labels=labels)
    problem = isolation_problem(name, network.attrs, internal=internal)
    if problem:
        raise NetworkIsolationError(problem)
    return gateway_of(name, network.attrs)


def subnets_of(attrs: Mapping[str, Any]) -> list[str]:
    """The network's subnets (CIDRs)."""
    configs = attrs.get("IPAM", {}).get("Config") or []
    return [str(config["Subnet"]) for config in configs if config.get("Subnet")]


def gateway_of(name: str, attrs: Mapping[str, Any]) -> str:
    configs = attrs.get("IPAM", {}).get("Config") or []
    gateways = [config["Gateway"] for config in configs if config.get("Gateway")]
    if not gateways:
        raise NetworkIsolationError(f"network {name} has no gateway address")
    return str(gateways[0]).split("/")[0]


def _create(
    client: docker.DockerClient,
    name: str,
    *,
    internal: bool,
    labels: Mapping[str, str] | None,
    options: Mapping[str, str] | None = None,
    ipam: docker.types.IPAMConfig | None = None,
) -> Any:
    """Create the network; a concurrent creation under the same name wins (Conflict: reuse it)."""
    try:
        network = client.networks.create(
            name,
            driver="bridge",
            internal=internal,
            labels=dict(labels or {}),
            options={**(options or {}), **ISOLATED_OPTIONS},
            ipam=ipam,
            check_duplicate=True,
        )
    except APIError as exc:
        if exc.status_code != 409:
            raise
        network = client.networks.get(name)
    network.reload()
    return network


@dataclass(frozen=True)
class Migration:
    """What `migrate_network` did: nothing, created, or recreated (the old bridge interface)."""

    network: str
    action: str  # "ok", "created" or "migrated"
    old_interface: str | None = None


def migrate_network(
    client: docker.DockerClient,
    name: str,
    labels: Mapping[str, str] | None = None,
    *,
    internal: bool,
) -> Migration:
    """Make `name` an isolated bridge: create it, keep it, or recreate it with icc off.

    Recreation keeps the subnet, gateway, labels and other options, so the proxy's address and
    every proxy URL stored with a workspace stay valid. A network with containers attached, running
    or stopped, is not touched (removing it would cut them off): the error names them.
    """
    try:
        network = client.networks.get(name)
    except NotFound:
        _create(client, name, internal=internal, labels=labels)
        return Migration(name, "created")
    attrs = network.attrs
    problem = kind_problem(name, attrs, internal=internal)
    if problem is not None:
        raise NetworkIsolationError(f"{problem}; remove it, then run `baseline host check` again")
    if not icc_enabled(attrs):
        return Migration(name, "ok")
    options = {k: v for k, v in (attrs.get("Options") or {}).items() if k != ICC_OPTION}
    # Stopped containers hold no endpoint (absent from the network's `Containers`) but would not
    # start again on a recreated network: they count as attached too.
    attached = sorted(
        {str(c.get("Name", cid)) for cid, c in (attrs.get("Containers") or {}).items()}
        | {str(c.name) for c in client.containers.list(all=True, filters={"network": name})}
    )
    if attached:
        raise NetworkIsolationError(
            f"network {name} lets its containers reach each other ({ICC_OPTION} is not false) "
            f"and cannot be migrated while containers are attached: {', '.join(attached)}; "
            "stop and remove them (or wait for their attempts to end), then run "
            "`baseline host check` again"
        )
    old_interface = options.get("com.docker.network.bridge.name") or f"br-{attrs['Id'][:12]}"
    pools = [
        docker.types.IPAMPool(subnet=config.get("Subnet"), gateway=config.get("Gateway"))
        for config in (attrs.get("IPAM", {}).get("Config") or [])
        if config.get("Subnet")
    ]
    network.remove()
    _create(
        client,
        name,
        internal=internal,
        labels={**(attrs.get("Labels") or {}), **(labels or {})},
        options=options,
        ipam=docker.types.IPAMConfig(pool_configs=pools) if pools else None,
    )
    return Migration(name, "migrated", old_interface)
