"""Host firewall of the egress network: its containers may reach the host only at the proxy.

An internal Docker network has no route out (Docker's DOCKER-ISOLATION rules drop whatever its
bridge would forward elsewhere), but packets addressed to the host itself are not forwarded: they
go through INPUT, which Docker leaves open. So any host service bound to a non-loopback address
(0.0.0.0, the bridge's gateway address) would be reachable from a filtered workspace, bypassing the
proxy. `restrict_to_proxy` closes that: a chain per bridge, jumped to from INPUT for everything
arriving on the bridge, accepts replies and TCP to `gateway:proxy_port` and drops the rest.

The rules are matched on the bridge interface, not the source address, so a container cannot
spoof its way past them. IPv6 is not filtered: Docker disables it inside containers on networks
created without IPv6 (measured: `net.ipv6.conf.all.disable_ipv6 = 1`), and `ensure_network` never
enables it. iptables runs on this machine, so only the local Docker Engine can be protected.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import docker

BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"
CHAIN_PREFIX = "BL-EGRESS-"
IPTABLES = "iptables"


class FirewallError(RuntimeError):
    """The rules could not be read or installed (iptables missing, not root, remote engine)."""


@dataclass(frozen=True)
class Bridge:
    """The host side of a Docker bridge network: its interface and its gateway address."""

    interface: str
    gateway: str

    @property
    def chain(self) -> str:
        return chain_name(self.interface)


def chain_name(interface: str) -> str:
    """The dedicated chain of one bridge (at most 25 characters; iptables allows 28)."""
    return f"{CHAIN_PREFIX}{interface}"


def require_local(docker_url: str) -> None:
    """iptables acts on this machine: refuse an engine reached over ssh:// or tcp://."""
    if urlparse(docker_url).scheme != "unix":
        raise FirewallError(
            f"the egress firewall is not supported for the remote Docker Engine at {docker_url}: "
            "its rules can only be installed on this machine"
        )


def bridge_of(client: docker.DockerClient, network: str) -> Bridge:
    """The interface and gateway of a bridge network (named by its option, else `br-<id12>`)."""
    return bridge_from(network, client.networks.get(network).attrs)


def bridge_from(network: str, attrs: Mapping[str, Any]) -> Bridge:
    """`bridge_of` on a network's inspected attributes."""
    if attrs.get("Driver") != "bridge":
        raise FirewallError(f"network {network} is not a bridge network")
    options = attrs.get("Options") or {}
    interface = options.get(BRIDGE_NAME_OPTION) or f"br-{attrs['Id'][:12]}"
    configs = attrs.get("IPAM", {}).get("Config") or []
    gateways = [config["Gateway"] for config in configs if config.get("Gateway")]
    if not gateways:
        raise FirewallError(f"network {network} has no gateway address")
    return Bridge(interface=interface, gateway=str(gateways[0]).split("/")[0])


def rules(bridge: Bridge, proxy_port: int) -> list[list[str]]:
    """The chain's rules, in order: replies, the proxy, then nothing else."""
    return [
        ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"],
        ["-d", f"{bridge.gateway}/32", "-p", "tcp", "--dport", str(proxy_port), "-j", "ACCEPT"],
        ["-j", "DROP"],
    ]


def jump(bridge: Bridge) -> list[str]:
    return ["-i", bridge.interface, "-j", bridge.chain]


def restrict_to_proxy(bridge: Bridge, proxy_port: int, *, iptables: str = IPTABLES) -> bool:
    """Install (or refresh) the rules; False when they were already in place, True if changed.

    The chain is declared and filled in one `iptables-restore --noflush` transaction, so a port
    change never leaves a moment with the chain empty (its declaration flushes the old rules).
    """
    if not 0 < proxy_port < 65536:
        raise FirewallError(f"invalid proxy port {proxy_port}")
    wanted = rules(bridge, proxy_port)
    jumped = _present(iptables, ["-C", "INPUT", *jump(bridge)])
    if jumped and _chain_is(iptables, bridge.chain, wanted):
        return False
    lines = ["*filter", f":{bridge.chain} - [0:0]"]
    lines += [" ".join(["-A", bridge.chain, *rule]) for rule in wanted]
    if not jumped:
        lines.append(" ".join(["-I", "INPUT", "1", *jump(bridge)]))
    lines.append("COMMIT")
    _run([f"{iptables}-restore", "-w", "--noflush"], "\n".join(lines) + "\n")
    return True


def remove(interface: str, *, iptables: str = IPTABLES) -> None:
    """Remove a bridge's jump and chain (none there: nothing to do)."""
    bridge_jump = ["-i", interface, "-j", chain_name(interface)]
    while _present(iptables, ["-C", "INPUT", *bridge_jump]):
        _run([iptables, "-w", "-D", "INPUT", *bridge_jump])
    if _present(iptables, ["-S", chain_name(interface)]):
        _run([iptables, "-w", "-F", chain_name(interface)])
        _run([iptables, "-w", "-X", chain_name(interface)])


def installed(chain: str, *, iptables: str = IPTABLES) -> list[str]:
    """The chain's rules as `iptables -S` lists them ([] when there is no such chain)."""
    command = [iptables, "-w", "-S", chain]
    result = _call(command)
    if result.returncode == 1:
        return []
    if result.returncode != 0:
        raise FirewallError(_failure(command, result))
    return [line for line in result.stdout.splitlines() if line.startswith("-A ")]


def _chain_is(iptables: str, chain: str, wanted: list[list[str]]) -> bool:
    """Whether the chain holds exactly `wanted`: as many rules, each one present, in order."""
    present = installed(chain, iptables=iptables)
    if len(present) != len(wanted) or not present[-1].endswith("-j DROP"):
        return False
    return all(_present(iptables, ["-C", chain, *rule]) for rule in wanted)


def _present(iptables: str, args: list[str]) -> bool:
    """Run a check (-C, -S): exit 0 is yes, 1 or 2 (no such rule, chain or target) is no."""
    command = [iptables, "-w", *args]
    result = _call(command)
    if result.returncode in (0, 1, 2):
        return result.returncode == 0
    raise FirewallError(_failure(command, result))


def _run(command: list[str], stdin: str | None = None) -> None:
    result = _call(command, stdin)
    if result.returncode != 0:
        raise FirewallError(_failure(command, result))


def _failure(command: list[str], result: subprocess.CompletedProcess[str]) -> str:
    detail = (result.stderr or result.stdout).strip()
    return f"{' '.join(command)} failed (exit {result.returncode}): {detail}"


def _call(command: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError:
        raise FirewallError(
            f"{command[0]} is not installed: the egress network cannot be restricted to its "
            "proxy without it"
        ) from None
    except subprocess.TimeoutExpired:
        raise FirewallError(f"{' '.join(command)} did not answer within 30s") from None
