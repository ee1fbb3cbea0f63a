"""Commands on the host of a Docker engine reached over `ssh://`, through the Docker API alone.

The egress firewall (`infra.egress.firewall`) must be installed where the engine runs, in the
network namespace in which dockerd writes its own iptables rules. The Docker API is the one channel
to that host the project always has, so a short-lived helper container does it: host PID and
network namespaces, the capabilities nsenter and iptables need (NET_ADMIN, SYS_ADMIN, SYS_PTRACE,
not `privileged`, which some engines refuse when their own capability set is reduced), and
`nsenter` into the mount and network namespaces of the dockerd process itself, so that the host's
own iptables binary (and its nft or legacy backend) is the one used. dockerd rather than PID 1:
the rules must live where Docker's do, and PID 1's namespaces may be closed to the container (as
measured on this machine's sandbox) while dockerd's never are to a process it started.

Every exec over SSH costs seconds, so each operation is one script in one container run; the
scripts come from `infra.egress.firewall`, which also holds the local (subprocess) variant.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from urllib.parse import urlparse

import docker
from docker.errors import DockerException

from infra.egress import firewall
from infra.egress.proxy_image import ensure_proxy_image
from infra.image_build import ImageBuildError

HELPER_LABELS = {"baseline.component": "egress-firewall"}
PRELUDE = """\
pid=$(pgrep -o -x dockerd) || { echo "no dockerd process on the engine's host" >&2; exit 3; }
IPTABLES="nsenter -t $pid -m -n -- iptables"
IPTABLES_RESTORE="nsenter -t $pid -m -n -- iptables-restore"
nsenter -t "$pid" -m -n -- sh -c 'command -v iptables-restore' >/dev/null || {
  echo "iptables-restore is not installed on the engine's host" >&2; exit 127; }
"""
TIMEOUT_S = 60


def run_script(
    client: docker.DockerClient,
    script: str,
    *,
    image: str,
    labels: Mapping[str, str] | None = None,
) -> str:
    """Run `script` (sh) on the engine's host; its stdout, or FirewallError with its output."""
    # $IPTABLES is a command with arguments: unquoted on purpose, so word splitting applies.
    body = PRELUDE + script.replace('"$IPTABLES"', "$IPTABLES").replace(
        '"$IPTABLES_RESTORE"', "$IPTABLES_RESTORE"
    )
    container = None
    try:
        container = client.containers.run(
            image,
            ["sh", "-c", body],
            detach=True,
            pid_mode="host",
            network_mode="host",
            cap_add=["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"],
            security_opt=["apparmor=unconfined"],
            labels={**HELPER_LABELS, **(labels or {})},
        )
        status = container.wait(timeout=TIMEOUT_S)
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        err = container.logs(stdout=False, stderr=True).decode(errors="replace")
    except DockerException as exc:
        raise FirewallHostError(f"the firewall helper container failed: {exc}") from exc
    except Exception as exc:  # a wait timeout surfaces as requests' or paramiko's own errors
        raise FirewallHostError(f"the firewall helper did not finish: {exc}") from exc
    finally:
        if container is not None:
            with contextlib.suppress(DockerException):  # already gone: nothing is left behind
                container.remove(force=True)
    code = int(status.get("StatusCode", -1))
    if code != 0:
        detail = (err or out).strip().splitlines()[-5:]
        raise FirewallHostError(
            f"the firewall script on the engine's host exited {code}: {' | '.join(detail)}"
        )
    return out


class FirewallHostError(firewall.FirewallError):
    """The helper container could not run, or its script failed (the message says which)."""


class EngineHostFirewall:
    """The per-bridge rules on the host of a remote engine, each operation one helper run."""

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        image: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self._image = image
        self.labels = dict(labels or {})

    @property
    def image(self) -> str:
        """The helper's image: the proxy image (it has nsenter and pgrep), built on first use."""
        if self._image is None:
            try:
                self._image = ensure_proxy_image(self.client).tag
            except (ImageBuildError, DockerException) as exc:
                raise FirewallHostError(f"the firewall helper image: {exc}") from exc
        return self._image

    def _run(self, script: str) -> str:
        return run_script(self.client, script, image=self.image, labels=self.labels)

    def restrict_to_proxy(
        self, bridge: firewall.Bridge, proxy_port: int, owner: str = firewall.DEFAULT_OWNER
    ) -> bool:
        out = self._run(firewall.restrict_script(bridge, proxy_port, owner))
        return out.strip().splitlines()[-1:] == ["changed"]

    def remove(self, interface: str) -> None:
        self._run(firewall.remove_script(interface))

    def installed(self, chain: str) -> list[str]:
        return [line for line in self._run(firewall.installed_script(chain)).splitlines() if line]

    def guards(self, bridge: firewall.Bridge) -> bool:
        last = [line for line in self._run(firewall.guards_script(bridge)).splitlines() if line]
        return firewall.ends_in_drop(last)


def firewall_for(
    docker_url: str, client: docker.DockerClient, labels: Mapping[str, str] | None = None
) -> firewall.Firewall:
    """Iptables here for this machine's engine (`unix://`), the helper container otherwise."""
    if urlparse(docker_url).scheme == "unix":
        return firewall.LocalFirewall()
    return EngineHostFirewall(client, labels=labels)
