"""What a `baseline demo` makes on the Docker Engine is its own, and goes when the demo ends.

Why its own: workspaces carry their deployment's label (`baseline.deployment`, from
BASELINE_DEPLOYMENT), and reconcile removes the containers of its deployment that its database
does not know. A demo running as the `default` deployment (or whichever one its shell names)
took a real portal's workspaces on the same engine for its orphans. So the demo runs as a
deployment named after its home (`own_deployment`): a later demo on the same home finds its own
leftovers, and nothing else.

Why a separate process removes them: the demo's own threads (agent runs, scoring, the scheduler's
jobs) may be making or restarting a workspace at the moment it is told to stop, and would make
one again behind a clean-up in the same process. The reaper (`start_reaper`) waits, in a session
of its own, for the end of the pipe the demo holds open: that end closes only when the demo
process is gone, however it ended (Ctrl-C, SIGTERM, a crash, even SIGKILL), and nothing of the
demo runs any more. It then removes the deployment's containers and volumes, a bounded volume's
disk image (`infra.disk_images`) with it, and any network carrying its label (the egress bridge
is the engine's, shared by its deployments, and stays), and says so on the demo's output.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

DEPLOYMENT_ENV = "BASELINE_DEPLOYMENT"  # read by `baseline.workspaces.backends`


def own_deployment(home: Path, inherited: str | None) -> str:
    """The demo's deployment: named after its home, after the inherited one when there is one
    (a test run's demo stays a ``test-`` deployment, which the leak check watches)."""
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:10]
    return f"{inherited}-demo-{digest}" if inherited else f"demo-{digest}"


def use_own_deployment(home: Path) -> str:
    """Make this process's workspaces the demo's own deployment (see the module); its name."""
    deployment = own_deployment(home, os.environ.get(DEPLOYMENT_ENV))
    os.environ[DEPLOYMENT_ENV] = deployment
    return deployment


@dataclass
class Removed:
    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def remove_deployment(url: str, deployment: str) -> Removed:
    """Remove what `deployment` has on the engine at `url`: every container, then every volume,
    each as its workspace's destroy removes it (a bounded one's disk image first), then every
    network with its host firewall chain. Only what carries the deployment's label: nothing of
    another deployment is touched."""
    # Here, not at the top: the reaper waits the demo's whole life before it needs them.
    from docker.errors import DockerException, NotFound

    from baseline.workspaces.backends import DEPLOYMENT_LABEL
    from infra.docker_backend import WORKSPACE_LABEL, DockerBackend
    from infra.egress import firewall
    from infra.egress.engine_host import firewall_for
    from infra.workspace import WorkspaceError, WorkspaceHandle

    removed = Removed()
    backend = DockerBackend.from_url(url, labels={DEPLOYMENT_LABEL: deployment}, disk_quota=True)
    selector = {"label": [f"{DEPLOYMENT_LABEL}={deployment}"]}
    try:
        for container in backend.client.containers.list(all=True, filters=selector):
            try:
                container.remove(force=True)
            except NotFound:
                continue
            except DockerException as exc:
                removed.errors.append(f"container {container.name}: {exc}")
                continue
            removed.containers.append(str(container.name))
        for volume in backend.client.volumes.list(filters=selector):
            name = str(volume.name)
            owner = (volume.attrs.get("Labels") or {}).get(WORKSPACE_LABEL, name)
            try:
                backend.destroy(WorkspaceHandle(owner, backend.name, "", None, name))
            except (DockerException, WorkspaceError) as exc:
                removed.errors.append(f"volume {name}: {exc}")
                continue
            removed.volumes.append(name)
        host_firewall = firewall_for(url, backend.client)
        for network in backend.client.networks.list(filters=selector):
            name = str(network.name)
            try:
                network.reload()
                # Not a bridge with a gateway, or no iptables here: no chain to remove.
                with contextlib.suppress(firewall.FirewallError, KeyError):
                    host_firewall.remove(firewall.bridge_from(name, network.attrs).interface)
                network.remove()
            except DockerException as exc:
                removed.errors.append(f"network {name}: {exc}")
                continue
            removed.networks.append(name)
    finally:
        backend.close()
    return removed


# The reaper and the end of its pipe this process keeps open: never closed here, the kernel
# closes it when the process ends (a file object would close it when collected, too early).
_reapers: list[tuple[subprocess.Popen[bytes], int]] = []


def start_reaper(url: str, deployment: str) -> None:
    """Start the process that removes `deployment` from the engine at `url` once this one has
    ended (see the module). It prints what it removed on this process's output."""
    read_end, write_end = os.pipe()  # not inheritable: no other child holds it open
    try:
        reaper = subprocess.Popen(
            [sys.executable, "-m", __name__, url, deployment],
            stdin=read_end,
            start_new_session=True,  # a Ctrl-C at the terminal is not for it
        )
    finally:
        os.close(read_end)
    _reapers.append((reaper, write_end))


def reap(url: str, deployment: str) -> int:
    """The reaper: wait until the demo has ended (end of input), then remove its deployment."""
    while sys.stdin.buffer.read(4096):
        pass
    try:
        removed = remove_deployment(url, deployment)
    except Exception as exc:  # whatever failed, one line: the demo's output is a user's terminal
        print(f"demo clean-up: {deployment} not removed from {url}: {exc}", file=sys.stderr)
        return 1
    print(
        f"demo clean-up: removed {len(removed.containers)} container(s), "
        f"{len(removed.volumes)} volume(s) and {len(removed.networks)} network(s) of "
        f"deployment {deployment} from {url}",
        flush=True,
    )
    for error in removed.errors:
        print(f"demo clean-up: not removed: {error}", file=sys.stderr)
    return 1 if removed.errors else 0


if __name__ == "__main__":
    sys.exit(reap(*sys.argv[1:]))
