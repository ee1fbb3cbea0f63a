"""A host's workspace networks keep workspaces apart and away from the host: checked (and
migrated) by `host check`.

Each project network of the host (the egress network of `open`/`blacklist` studies, see
`infra.egress.network` for the design) is made isolated if missing, migrated if it was made before
isolation existed (icc on, nothing attached), or refused with a message naming what to do; then the
probe pair (`infra.isolation_probe`) proves on each network that one container cannot connect to
another's port, and a network that carries workspaces must have its host firewall in place
(`infra.egress.firewall`: without it they reach every service of the host). The routed bridge of
earlier versions (`RETIRED_NETWORKS`), never firewalled, is removed, or reported while containers
still use it. A host failing any of this is reported unhealthy, so no study starts on it. A migrated
egress bridge gets a new interface: the old interface's firewall chain is removed here (on an
`ssh://` engine's host through the helper container of `infra.egress.engine_host`), and the gateway
firewalls the new one before any workspace joins it (`EgressGateway.ensure_running`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import docker
from docker.errors import DockerException, NotFound

from baseline.workspaces import egress_gateway
from infra import isolation_probe
from infra.docker_backend import WORKSPACE_LABEL
from infra.egress import firewall
from infra.egress.engine_host import firewall_for
from infra.egress.network import NetworkIsolationError, migrate_network


@dataclass(frozen=True)
class ProjectNetwork:
    name: str
    labels: Mapping[str, str]
    internal: bool


PROJECT_NETWORKS = (
    ProjectNetwork(egress_gateway.NETWORK, egress_gateway.NETWORK_LABELS, internal=True),
)
# Networks earlier versions made that no workspace may use any more: `baseline-open`, a routed
# bridge whose containers reached the portal, the host's services and 169.254.169.254.
RETIRED_NETWORKS = ("baseline-open",)


@dataclass
class IsolationReport:
    """What the check did (`notes`: created, migrated) and what is wrong (`problems`)."""

    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def check(
    docker_url: str,
    networks: Sequence[ProjectNetwork] | None = None,
    *,
    probe_labels: Mapping[str, str] | None = None,
    retired: Sequence[str] = RETIRED_NETWORKS,
) -> IsolationReport:
    """Make each network (default: `PROJECT_NETWORKS`) isolated, or say why not, probe it, and
    check that the host firewalls it once it carries workspaces; remove the `retired` ones."""
    report = IsolationReport()
    networks = PROJECT_NETWORKS if networks is None else networks
    try:
        client = docker.DockerClient(base_url=docker_url, use_ssh_client=False, timeout=60)
    except DockerException as exc:
        report.problems.append(f"cannot reach the Docker Engine at {docker_url}: {exc}")
        return report
    try:
        for name in retired:
            _remove_retired(client, name, report)
        ready = [
            network for network in networks if _make_isolated(client, docker_url, network, report)
        ]
        # The probes run side by side: each waits seconds for a connection that must time out,
        # and a host check (run for every host, and before every study on it) waited for each
        # network in turn.
        with ThreadPoolExecutor(max_workers=max(1, len(ready))) as pool:
            problems = list(pool.map(lambda network: _probe(client, network, probe_labels), ready))
        report.problems.extend(problem for problem in problems if problem)
        for network in ready:
            if problem := _firewall_problem(client, docker_url, network.name, probe_labels):
                report.problems.append(problem)
    finally:
        client.close()
    return report


def _make_isolated(
    client: docker.DockerClient, docker_url: str, network: ProjectNetwork, report: IsolationReport
) -> bool:
    """Create or migrate `network` (noted in `report`); whether it can be probed."""
    try:
        migration = migrate_network(client, network.name, network.labels, internal=network.internal)
    except (NetworkIsolationError, DockerException) as exc:
        report.problems.append(str(exc))
        return False
    if migration.action == "created":
        report.notes.append(f"created network {network.name} (isolated)")
    elif migration.action == "migrated":
        report.notes.append(
            f"migrated network {network.name}: recreated with inter-container "
            "communication off, same subnet and gateway"
        )
        if migration.old_interface:
            try:
                firewall_for(docker_url, client).remove(migration.old_interface)
            except firewall.FirewallError as exc:
                report.notes.append(f"the old bridge's firewall chain was left in place: {exc}")
    return True


def _remove_retired(client: docker.DockerClient, name: str, report: IsolationReport) -> None:
    """Remove a retired network, or report the containers that keep it (it cannot be removed
    under them, and they are as exposed as it was made)."""
    try:
        network = client.networks.get(name)
        attached = sorted(
            str(container.get("Name", container_id))
            for container_id, container in (network.attrs.get("Containers") or {}).items()
        )
        if attached:
            report.problems.append(
                f"network {name} (a routed bridge of an earlier version, which does not keep its "
                f"containers away from the host) still carries {', '.join(attached)}: remove "
                "them, then check the host again"
            )
            return
        network.remove()
    except NotFound:
        return
    except DockerException as exc:
        report.problems.append(f"network {name} (retired) could not be removed: {exc}")
        return
    report.notes.append(f"removed network {name} (a routed bridge of an earlier version)")


def _firewall_problem(
    client: docker.DockerClient, docker_url: str, name: str, labels: Mapping[str, str] | None
) -> str | None:
    """Once workspaces run on the network, the host must drop what they send it (but the proxy):
    the gateway installs that before the first one joins (`EgressGateway.ensure_running`, again
    in the scheduler's egress job), so workspaces on an unguarded bridge mean the rules were
    lost (flushed by hand, a host reboot) and they reach every service on the host's
    addresses. A network without running workspaces needs no rules yet (a new host)."""
    try:
        workspaces = client.containers.list(filters={"network": name, "label": WORKSPACE_LABEL})
        if not workspaces:
            return None
        bridge = firewall.bridge_of(client, name)
        if firewall_for(docker_url, client, labels).guards(bridge):
            return None
    except (DockerException, firewall.FirewallError) as exc:
        return f"the host firewall of network {name} not verified: {exc}"
    return (
        f"network {name} carries {len(workspaces)} workspace(s) but the host does not firewall "
        f"its bridge {bridge.interface} (no jump from INPUT to {bridge.chain} ending in DROP): "
        "they reach every service on the host's addresses; a running portal's egress job "
        "installs the rules again within minutes (start the portal), then check the host again"
    )


def _probe(
    client: docker.DockerClient, network: ProjectNetwork, labels: Mapping[str, str] | None
) -> str | None:
    """The probe pair on `network`: the problem found, or None when it isolates."""
    try:
        result = isolation_probe.probe(client, network.name, labels=labels)
    except isolation_probe.ProbeError as exc:
        return f"isolation of network {network.name} not verified: {exc}"
    return result.problem
