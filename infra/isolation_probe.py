"""The isolation probe: two containers on one network; the second must not reach the first.

What `infra.egress.network` configures (icc off) is only a request to dockerd; whether packets
between two containers are really dropped depends on the host (bridged traffic must pass through
iptables, `br_netfilter`). So the check is made by trying, as a participant would: container A
listens on a TCP port, container B (as another attempt's workspace) connects to A by IP and by
container name. A proves it listens (it connects to its own port), so B's failure means the
network stopped it, not that nothing was there. B's outcome per target: `connected` (the host
does not isolate), `timeout` (dropped: isolated), `unresolved` (the name is not even known),
`refused`/`unreachable` (rejected on the way: a rule of the host's, also isolated).

It runs on any engine the SDK reaches (`ssh://` too) with an image already on that host (a
workspace image, else the base image: both have python3; no pull, hosts may have no registry).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import docker
from docker.errors import DockerException, NotFound
from docker.models.containers import Container

from infra.image_build import BASE_REPOSITORY

PORT = 8000
COMPONENT_LABELS = {"baseline.component": "isolation-probe"}
WORKSPACE_IMAGE_LABEL = "baseline.image=workspace"
CONNECT_TIMEOUT_S = 3.0
REACHED = "connected"

# Inside B: one JSON object, target -> outcome; targets are tried concurrently.
CONNECT = """
import json, socket, sys, threading
port, timeout, targets = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
outcomes = {}
def attempt(target):
    try:
        address = socket.gethostbyname(target)
    except OSError:
        outcomes[target] = "unresolved"
        return
    try:
        socket.create_connection((address, port), timeout).close()
        outcomes[target] = "connected"
    except socket.timeout:
        outcomes[target] = "timeout"
    except ConnectionRefusedError:
        outcomes[target] = "refused"
    except OSError as error:
        outcomes[target] = "unreachable: " + type(error).__name__
threads = [threading.Thread(target=attempt, args=(t,)) for t in targets]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(outcomes))
"""
SELF_CHECK = (
    "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1).close()"
)


class ProbeError(RuntimeError):
    """The probe could not be run (no image, the engine refused, A never listened)."""


@dataclass(frozen=True)
class ProbeResult:
    """B's outcome towards A, per target (A's address, A's container name)."""

    network: str
    outcomes: dict[str, str] = field(default_factory=dict)

    @property
    def isolated(self) -> bool:
        return bool(self.outcomes) and all(o != REACHED for o in self.outcomes.values())

    @property
    def problem(self) -> str | None:
        reached = sorted(target for target, o in self.outcomes.items() if o == REACHED)
        if not reached:
            return None
        return (
            f"network {self.network} does not isolate workspaces: a probe container connected "
            f"to another's port {PORT} at {', '.join(reached)} (is br_netfilter loaded and "
            "net.bridge.bridge-nf-call-iptables=1 on this host?)"
        )


def probe_image(client: docker.DockerClient) -> str:
    """An image on this engine with python3: a workspace image, else the base image."""
    for image in client.images.list(filters={"label": WORKSPACE_IMAGE_LABEL}):
        return str(image.id)
    for image in client.images.list(name=BASE_REPOSITORY):
        return str(image.id)
    raise ProbeError(
        "no workspace image on this host to probe network isolation with; build one with "
        "`baseline image build cpu --docker-url URL`"
    )


def probe(
    client: docker.DockerClient,
    network: str,
    *,
    image: str | None = None,
    labels: Mapping[str, str] | None = None,
    listen_timeout_s: float = 20.0,
) -> ProbeResult:
    """Run the probe pair on `network` and remove it again, whatever happened."""
    stamp = uuid.uuid4().hex[:10]
    made: list[Container] = []
    all_labels = {**COMPONENT_LABELS, **(labels or {})}
    # The two containers are made and removed side by side: over ssh each request costs a
    # round trip, and a host check probes every project network.
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        image = image or probe_image(client)
        pair = [
            pool.submit(
                _run, client, image, f"bl-probe-{stamp}-a", network, all_labels,
                ["python3", "-m", "http.server", str(PORT), "--bind", "0.0.0.0"],
            ),
            pool.submit(
                _run, client, image, f"bl-probe-{stamp}-b", network, all_labels, ["sleep", "120"]
            ),
        ]  # fmt: skip
        wait(pair)
        made.extend(future.result() for future in pair if future.exception() is None)
        server, client_box = (future.result() for future in pair)  # raises the first failure
        _wait_listening(server, listen_timeout_s)
        server.reload()
        address = server.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]
        if not address:
            raise ProbeError(f"probe container A has no address on {network}")
        result = client_box.exec_run(
            ["python3", "-c", CONNECT, str(PORT), str(CONNECT_TIMEOUT_S), address, server.name]
        )
        if result.exit_code != 0:
            raise ProbeError(f"probe container B failed: {result.output.decode()[-300:]}")
        outcomes = json.loads(result.output.decode().strip().splitlines()[-1])
        return ProbeResult(network, {str(k): str(v) for k, v in outcomes.items()})
    except DockerException as exc:
        raise ProbeError(f"probing network {network}: {exc}") from exc
    finally:
        wait([pool.submit(_remove, container) for container in made])
        pool.shutdown()


def _remove(container: Container) -> None:
    with contextlib.suppress(NotFound, DockerException):
        container.remove(force=True)


def _run(
    client: docker.DockerClient,
    image: str,
    name: str,
    network: str,
    labels: Mapping[str, str],
    command: list[str],
) -> Container:
    return client.containers.run(
        image,
        command,
        name=name,
        network=network,
        labels=dict(labels),
        detach=True,
        init=True,
        security_opt=["no-new-privileges"],
    )


def _wait_listening(server: Container, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.exec_run(["python3", "-c", SELF_CHECK, str(PORT)]).exit_code == 0:
            return
        time.sleep(0.3)
    server.reload()
    raise ProbeError(f"probe container A did not listen on {PORT} ({server.status})")
