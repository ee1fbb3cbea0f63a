"""Access to the real Docker Engine (local socket and over SSH) for the workspace tests.

Everything a test creates carries `TEST_LABELS` (``baseline.test-run=<id>``) so that
scripts/leak-check.sh can prove nothing was left behind. Missing services FAIL when
BASELINE_REQUIRE_SERVICES=1 (CI) and skip with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from baseline.workspaces.backends import DEPLOYMENT_LABEL
from infra.docker_backend import DockerBackend
from infra.image_build import build_workspace_image

TEST_RUN_LABEL = "baseline.test-run"
RUN_ID = uuid.uuid4().hex[:12]
TEST_LABELS = {TEST_RUN_LABEL: RUN_ID}
# `baseline` processes the tests start (and this one: tests/conftest.py) run as a deployment
# named so; scripts/leak-check.sh fails on anything of such a deployment left on the engine.
DEPLOYMENT_PREFIX = "test-"
LOCAL_URL = os.environ.get("BASELINE_TEST_DOCKER_URL", "unix:///var/run/docker.sock")


def unavailable(reason: str) -> None:
    """Fail in CI, skip elsewhere, always naming what is missing."""
    if os.environ.get("BASELINE_REQUIRE_SERVICES") == "1":
        pytest.fail(f"required service missing: {reason}")
    pytest.skip(reason)


def docker_url(kind: str) -> str:
    """The engine URL for `unix` or `ssh`, checked to answer."""
    if kind == "unix":
        url = LOCAL_URL
    else:
        url = os.environ.get("BASELINE_TEST_SSH_URL", "")
        if not url:
            unavailable("BASELINE_TEST_SSH_URL is not set (scripts/services/30-sshd.sh sets it)")
    try:
        client = docker.DockerClient(base_url=url, use_ssh_client=False, timeout=30)
        client.ping()
        client.close()
    except Exception as exc:  # any failure to reach the engine means the service is missing
        unavailable(f"Docker Engine at {url} is not reachable: {exc}")
    return url


def _interface_ipv4(interface: str) -> str:
    """The IPv4 address of a local network interface (SIOCGIFADDR), without parsing `ip` output."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("256s", interface.encode()[:15])
        answer = fcntl.ioctl(sock.fileno(), siocgifaddr, request)
    return socket.inet_ntoa(answer[20:24])


def default_bridge_address(client: docker.DockerClient) -> str:
    """The host's own address on Docker's default bridge network (a private address).

    Right after a fresh dockerd starts, the default bridge's IPAM config may list only the
    subnet, with no `Gateway` (seen on a new machine); the bridge interface itself always carries
    the address, so read it there when the IPAM config does not say.
    """
    attrs = client.networks.get("bridge").attrs
    configs = attrs.get("IPAM", {}).get("Config") or []
    for config in configs:
        if config.get("Gateway"):
            return str(config["Gateway"]).split("/")[0]
    interface = (attrs.get("Options") or {}).get("com.docker.network.bridge.name", "docker0")
    return _interface_ipv4(interface)


def workspace_image() -> str:
    """The CPU workspace image (built and cached by scripts/services/20-docker.sh)."""
    image = os.environ.get("BASELINE_TEST_IMAGE")
    if image:
        return image
    client = docker.DockerClient(base_url=docker_url("unix"), use_ssh_client=False)
    try:
        return build_workspace_image(client, "cpu").tag
    finally:
        client.close()


def new_name(prefix: str = "bl-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def new_deployment(purpose: str) -> str:
    """A deployment name for a `baseline` process a test starts (BASELINE_DEPLOYMENT): its
    workspaces carry it, scripts/leak-check.sh fails on any left with a ``test-`` one, and
    `remove_deployment` removes them once the process is gone."""
    return f"{DEPLOYMENT_PREFIX}{purpose}-{uuid.uuid4().hex[:8]}"


def remove_deployment(deployment: str) -> None:
    """Remove what a deployment left on the local engine: its containers, then its volumes (by
    the backend's own removal: a bounded volume's disk image with it, in the backend's order),
    then its networks. A test's `baseline` process is stopped mid-work, with workspaces still
    live: this is their destroy."""
    import time

    import requests
    from docker.errors import DockerException

    from infra.workspace import WorkspaceError

    if not _engine_answers():
        return  # without an engine the process made nothing there (the leak check would say)
    backend = DockerBackend.from_url(LOCAL_URL, disk_quota=True)
    try:
        selector = {"label": f"{DEPLOYMENT_LABEL}={deployment}"}
        for container in backend.client.containers.list(all=True, filters=selector):
            container.remove(force=True)
        for volume in backend.client.volumes.list(filters=selector):
            # A volume of a container removed a moment ago can still be busy in the engine
            # (seen: the engine dropping the connection); a few tries, the last one raises.
            for tries_left in (3, 2, 1, 0):
                try:
                    backend._remove_volume(str(volume.name))
                    break
                except (DockerException, WorkspaceError, requests.ConnectionError):
                    if not tries_left:
                        raise
                    time.sleep(2)
        _remove_networks(backend, selector)
    finally:
        backend.close()


def _remove_networks(backend: DockerBackend, selector: dict[str, str]) -> None:
    """Remove the selected networks, each with its host firewall chain (an egress network's)."""
    from infra.egress import firewall

    for network in backend.client.networks.list(filters=selector):
        network.reload()
        # Not a bridge with a gateway, or no iptables here: no chain to remove.
        with contextlib.suppress(firewall.FirewallError, KeyError):
            firewall.remove(firewall.bridge_from(str(network.name), network.attrs).interface)
        network.remove()


@pytest.fixture(scope="session")
def test_image() -> str:
    docker_url("unix")
    return workspace_image()


@pytest.fixture(params=["unix", "ssh"])
def backend(request: pytest.FixtureRequest) -> Iterator[DockerBackend]:
    """The Docker backend over the local socket, then over ssh:// to a real sshd."""
    instance = DockerBackend.from_url(docker_url(request.param), labels=TEST_LABELS)
    yield instance
    instance.close()


@pytest.fixture
def world_readable_tmp() -> Iterator[Path]:
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="bl-test-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


DOCKERD_PID = Path("/var/run/docker.pid")
DOCKERD_LOG = Path("/tmp/baseline-dockerd.log")
CONTAINERD_PID = Path("/var/run/docker/containerd/containerd.pid")


def _engine_answers() -> bool:
    try:
        client = docker.DockerClient(base_url=LOCAL_URL, use_ssh_client=False, timeout=5)
        client.ping()
        client.close()
        return True
    except Exception:  # not answering, for whatever reason
        return False


def process_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (dead, not yet reaped by its new parent) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pid_in(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _remove_stale_pid_files() -> None:
    """Remove dockerd's and containerd's pid files when the process they name is gone.

    A killed process stays a zombie until its parent reaps it, and dockerd takes any existing
    /proc entry for a live process: it refuses to start ("pid file found"), or waits a minute on
    the socket of a containerd that is no more.
    """
    for pid_file in (DOCKERD_PID, CONTAINERD_PID):
        pid = _pid_in(pid_file)
        if pid is not None and not process_alive(pid):
            pid_file.unlink(missing_ok=True)


def start_dockerd(wait_s: float = 90.0) -> None:
    """Start dockerd in its own session (it must outlive the test) and wait until it answers."""
    import subprocess
    import time

    _remove_stale_pid_files()
    with open(DOCKERD_LOG, "ab") as log:
        daemon = subprocess.Popen(
            ["dockerd", "--host", LOCAL_URL],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and daemon.poll() is None:
        if _engine_answers():
            return
        time.sleep(0.5)
    tail = DOCKERD_LOG.read_text(errors="replace").splitlines()[-3:]
    exited = daemon.poll()
    state = f"exited with {exited}" if exited is not None else f"not up in {wait_s}s"
    raise RuntimeError(f"dockerd {state}; {DOCKERD_LOG} ends: {tail}")


def kill_dockerd() -> None:
    """SIGKILL the running dockerd (as a crash would) and wait until it and its containerd are gone.

    dockerd's own containerd dies with it, but not at once: a dockerd started in between finds it
    still running and waits for a socket that is about to vanish.
    """
    import signal
    import time

    pid = int(DOCKERD_PID.read_text().strip())
    containerd = _pid_in(CONTAINERD_PID)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
        process_alive(pid) or (containerd is not None and process_alive(containerd))
    ):
        time.sleep(0.1)


def ensure_dockerd() -> None:
    if not _engine_answers():
        start_dockerd()
