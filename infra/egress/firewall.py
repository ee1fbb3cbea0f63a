"""Host firewall of the egress network: its containers may reach the host only at the proxy.

An internal Docker network has no route out (Docker's DOCKER-ISOLATION rules drop whatever its
bridge would forward elsewhere), but packets addressed to the host itself are not forwarded: they
go through INPUT, which Docker leaves open. So any host service bound to a non-loopback address
(0.0.0.0, the bridge's gateway address) would be reachable from a filtered workspace, bypassing the
proxy. `restrict_to_proxy` closes that: a chain per bridge, jumped to from INPUT for everything
arriving on the bridge, accepts replies and TCP to `gateway:proxy_port` and drops the rest.

Several deployments on one engine share its egress bridge, each with its own proxy on its own
port: each port's rule carries its owner (a comment, `baseline-owner:<deployment>`), and a
deployment installing its rules replaces only its own and keeps the others' (a chain holding one
port only cut every other deployment's workspaces off their proxy). Locally the read and the
rewrite happen under a lock file; on a remote host they are one script run.

The rules are matched on the bridge interface, not the source address, so a container cannot
spoof its way past them. IPv6 is not filtered: Docker disables it inside containers on networks
created without IPv6 (measured: `net.ipv6.conf.all.disable_ipv6 = 1`), and `ensure_network` never
enables it.

On this machine's engine the rules are installed with iptables run here (`restrict_to_proxy`,
`remove`, `installed`). On an `ssh://` engine the same checks and rules are written as one shell
script (`restrict_script`, `remove_script`, `installed_script`) that `infra.egress.engine_host`
runs on that host, through the Docker API, in the engine's own network namespace: one container
run per operation, since every exec over SSH costs seconds. `engine_host.firewall_for` picks the
one that fits an engine URL; both have the `Firewall` interface.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import docker

BRIDGE_NAME_OPTION = "com.docker.network.bridge.name"
CHAIN_PREFIX = "BL-EGRESS-"
IPTABLES = "iptables"
OWNER_PREFIX = "baseline-owner:"
DEFAULT_OWNER = "default"
OWNER_RE = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
REPLIES = ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"]
# Serialises this host's read-and-rewrite of a chain between deployments' processes.
LOCK_PATH = os.path.join(tempfile.gettempdir(), "baseline-egress-firewall.lock")


class FirewallError(RuntimeError):
    """The rules could not be read or installed (iptables missing, not root, host unreachable)."""


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


def own_rule(bridge: Bridge, proxy_port: int, owner: str) -> list[str]:
    """The rule that lets the bridge's containers reach `owner`'s proxy (argv form)."""
    return [
        "-d",
        f"{bridge.gateway}/32",
        "-p",
        "tcp",
        "--dport",
        str(proxy_port),
        "-m",
        "comment",
        "--comment",
        f"{OWNER_PREFIX}{owner}",
        "-j",
        "ACCEPT",
    ]


def jump(bridge: Bridge) -> list[str]:
    return ["-i", bridge.interface, "-j", bridge.chain]


def _checked(proxy_port: int, owner: str) -> None:
    if not 0 < proxy_port < 65536:
        raise FirewallError(f"invalid proxy port {proxy_port}")
    if not OWNER_RE.match(owner):
        raise FirewallError(f"invalid firewall owner {owner!r} (letters, digits, _ . - only)")


def _restore_line(chain: str, rule: list[str]) -> str:
    """A rule as an `iptables-restore` line (the comment quoted, as `iptables -S` prints it)."""
    words = [f'"{word}"' if word.startswith(OWNER_PREFIX) else word for word in rule]
    return " ".join(["-A", chain, *words])


def _owned_by(line: str, owner: str) -> bool:
    return f'--comment "{OWNER_PREFIX}{owner}"' in line


@contextmanager
def _host_lock() -> Iterator[None]:
    with open(LOCK_PATH, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def restrict_to_proxy(
    bridge: Bridge, proxy_port: int, owner: str = DEFAULT_OWNER, *, iptables: str = IPTABLES
) -> bool:
    """Install (or refresh) `owner`'s rules, keeping the other owners' proxy rules; False when
    they were already in place, True if changed.

    The chain is declared and filled in one `iptables-restore --noflush` transaction, so a port
    change never leaves a moment with the chain empty (its declaration flushes the old rules).
    """
    _checked(proxy_port, owner)
    mine = own_rule(bridge, proxy_port, owner)
    with _host_lock():
        jumped = _present(iptables, ["-C", "INPUT", *jump(bridge)])
        listed = installed(bridge.chain, iptables=iptables)
        tagged = [line for line in listed if f'--comment "{OWNER_PREFIX}' in line]
        own_lines = [line for line in tagged if _owned_by(line, owner)]
        if (
            jumped
            and len(own_lines) == 1
            and len(listed) == len(tagged) + 2
            and ends_in_drop(listed)
            and _present(iptables, ["-C", bridge.chain, *REPLIES])
            and _present(iptables, ["-C", bridge.chain, *mine])
        ):
            return False
        others = [line for line in tagged if not _owned_by(line, owner)]
        lines = ["*filter", f":{bridge.chain} - [0:0]", _restore_line(bridge.chain, REPLIES)]
        lines += [*others, _restore_line(bridge.chain, mine), f"-A {bridge.chain} -j DROP"]
        if not jumped:
            lines.append(" ".join(["-I", "INPUT", "1", *jump(bridge)]))
        lines.append("COMMIT")
        _run([f"{iptables}-restore", "-w", "--noflush"], "\n".join(lines) + "\n")
    return True


class Firewall(Protocol):
    """The per-bridge rules of one engine's host, wherever that host is."""

    def restrict_to_proxy(
        self, bridge: Bridge, proxy_port: int, owner: str = DEFAULT_OWNER
    ) -> bool: ...

    def remove(self, interface: str) -> None: ...

    def installed(self, chain: str) -> list[str]: ...

    def guards(self, bridge: Bridge) -> bool: ...


class LocalFirewall:
    """The rules of this machine's engine, with iptables run here."""

    def restrict_to_proxy(
        self, bridge: Bridge, proxy_port: int, owner: str = DEFAULT_OWNER
    ) -> bool:
        return restrict_to_proxy(bridge, proxy_port, owner)

    def remove(self, interface: str) -> None:
        remove(interface)

    def installed(self, chain: str) -> list[str]:
        return installed(chain)

    def guards(self, bridge: Bridge) -> bool:
        return guards(bridge)


def restrict_script(
    bridge: Bridge, proxy_port: int, owner: str = DEFAULT_OWNER, iptables: str = '"$IPTABLES"'
) -> str:
    """`restrict_to_proxy` as a POSIX shell script for another host: the same checks (jump there,
    the owner's rule once, only owners' rules between the replies and the last DROP) and the
    same single `iptables-restore` transaction keeping the other owners' rules; prints `changed`
    or `unchanged`. `iptables` is the shell word that runs iptables there (the script runs
    `${iptables}-restore` as `"$IPTABLES_RESTORE"` by default)."""
    _checked(proxy_port, owner)
    chain = shlex.quote(bridge.chain)
    mine = own_rule(bridge, proxy_port, owner)
    mark = shlex.quote(f'--comment "{OWNER_PREFIX}')
    own_mark = shlex.quote(f'--comment "{OWNER_PREFIX}{owner}"')
    head = ["*filter", f":{bridge.chain} - [0:0]", _restore_line(bridge.chain, REPLIES)]
    tail = [_restore_line(bridge.chain, mine), f"-A {bridge.chain} -j DROP"]
    restore_jump = " ".join(["-I", "INPUT", "1", *jump(bridge)])
    return "\n".join(
        [
            "set -e",
            f"listed=$({iptables} -w -S {chain} 2>/dev/null | grep '^-A ' || true)",
            f"if {iptables} -w -C INPUT {shlex.join(jump(bridge))} 2>/dev/null; then jumped=1; "
            "else jumped=0; fi",
            f'others=$(printf "%s\\n" "$listed" | grep -F -- {mark} | grep -v -F -- {own_mark} '
            "|| true)",
            f'mine=$(printf "%s\\n" "$listed" | grep -c -F -- {own_mark} || true)',
            f'tagged=$(printf "%s\\n" "$listed" | grep -c -F -- {mark} || true)',
            'count=$(printf "%s" "$listed" | grep -c . || true)',
            f'if [ "$jumped" = 1 ] && [ "$mine" = 1 ] && [ "$count" = $((tagged + 2)) ] && '
            'printf "%s" "$listed" | tail -n 1 | grep -q -- "-j DROP$" && '
            f"{iptables} -w -C {chain} {shlex.join(REPLIES)} 2>/dev/null && "
            f"{iptables} -w -C {chain} {shlex.join(mine)} 2>/dev/null; then",
            "  echo unchanged; exit 0",
            "fi",
            '{ printf "%s\\n" ' + " ".join(shlex.quote(line) for line in head),
            '  if [ -n "$others" ]; then printf "%s\\n" "$others"; fi',
            '  printf "%s\\n" ' + " ".join(shlex.quote(line) for line in tail),
            f'  if [ "$jumped" = 0 ]; then echo {shlex.quote(restore_jump)}; fi',
            '  echo COMMIT; } | "$IPTABLES_RESTORE" -w --noflush',
            "echo changed",
        ]
    )


def remove_script(interface: str, iptables: str = '"$IPTABLES"') -> str:
    """`remove` as a POSIX shell script for another host (nothing there: nothing to do)."""
    chain = shlex.quote(chain_name(interface))
    bridge_jump = shlex.join(["-i", interface, "-j", chain_name(interface)])
    return "\n".join(
        [
            "set -e",
            f"while {iptables} -w -C INPUT {bridge_jump} 2>/dev/null; do",
            f"  {iptables} -w -D INPUT {bridge_jump}",
            "done",
            f"if {iptables} -w -S {chain} >/dev/null 2>&1; then",
            f"  {iptables} -w -F {chain}; {iptables} -w -X {chain}",
            "fi",
        ]
    )


def installed_script(chain: str, iptables: str = '"$IPTABLES"') -> str:
    """`installed` as a POSIX shell script: the chain's `-A` lines (none: no such chain)."""
    return f"{iptables} -w -S {shlex.quote(chain)} 2>/dev/null | grep '^-A ' || true"


def guards_script(bridge: Bridge, iptables: str = '"$IPTABLES"') -> str:
    """`guards` as a POSIX shell script: prints the chain's last rule when INPUT jumps to it."""
    chain = shlex.quote(bridge.chain)
    return (
        f"if {iptables} -w -C INPUT {shlex.join(jump(bridge))} 2>/dev/null; then "
        f"{iptables} -w -S {chain} 2>/dev/null | grep '^-A ' | tail -n 1; fi"
    )


def guards(bridge: Bridge, *, iptables: str = IPTABLES) -> bool:
    """Whether the host drops what arrives on the bridge beyond the chain's exceptions: INPUT
    jumps to the bridge's chain and the chain ends in DROP (whatever port it lets through)."""
    if not _present(iptables, ["-C", "INPUT", *jump(bridge)]):
        return False
    return ends_in_drop(installed(bridge.chain, iptables=iptables))


def ends_in_drop(listed: list[str]) -> bool:
    """Whether a chain's listed rules (`iptables -S` lines) end in DROP."""
    return bool(listed) and listed[-1].rstrip().endswith("-j DROP")


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
