"""What the egress gateway tests share: a gateway per engine (local and ssh://) on a
test-labelled network, a test server on a private address, a blacklist attempt of the demo paper
task, and what runs inside its workspace.

One set-up and one teardown for both engines: the engine's URL decides the proxy (a process here,
a container on an ssh:// host) and the firewall (`firewall_for`), as it does in the gateway itself.
"""

from __future__ import annotations

import http.server
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from sqlalchemy import select

from baseline.context import Context
from baseline.models import Host, Workspace, WorkspacePurpose, WorkspaceStatus
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import egress_gateway, workspaces
from baseline.workspaces.egress_gateway import EgressGateway
from infra.blobs import BlobStore
from infra.docker_backend import DockerBackend
from infra.egress import firewall
from infra.egress.engine_host import firewall_for
from infra.egress.proxy import EgressProxyError, find_mitmdump
from infra.workspace import WorkspaceBackend, WorkspaceHandle
from tests.docker_env import (
    TEST_LABELS,
    default_bridge_address,
    docker_url,
    new_name,
    unavailable,
)
from tests.ok_http import OkHandler

DEMO_PAPER = tasks.DEMO_TASKS_DIR / "digits-baselines"

# Inside the workspace: urllib honours HTTP_PROXY (with the workspace's credentials).
CLIENT = """
import sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            print(response.status, url)
    except urllib.error.HTTPError as error:
        print(error.code, url)
    except Exception as error:
        print("error", url, type(error).__name__)
"""


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)


@dataclass
class Server:
    base: str
    seen: list[str]


@pytest.fixture
def server() -> Iterator[Server]:
    """An HTTP server on the host's address on Docker's default bridge (a private address)."""
    client = docker.DockerClient(base_url=docker_url("unix"), use_ssh_client=False)
    try:
        address = default_bridge_address(client)
    finally:
        client.close()
    seen: list[str] = []
    httpd = http.server.ThreadingHTTPServer(
        (address, 0), type("Recorder", (OkHandler,), {"seen": seen})
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield Server(f"http://{address}:{httpd.server_address[1]}", seen)
    httpd.shutdown()
    httpd.server_close()


@contextmanager
def gateway_on(ctx: Context, kind: str) -> Iterator[EgressGateway]:
    """This process's gateway for the `unix` or `ssh` engine, on a test-labelled network, in that
    host's state dir; afterwards every workspace, the gateway (and any other the test activated
    for the engine), its network and its firewall chain are removed."""
    url = docker_url(kind)
    try:
        find_mitmdump()  # the proxy, or on an ssh:// engine its image, is made from the egress venv
    except EgressProxyError as exc:
        unavailable(str(exc))
    network = new_name("bl-test-egress")
    instance = EgressGateway(
        egress_gateway.state_dir(ctx.settings, url),
        docker_url=url,
        network=network,
        labels=TEST_LABELS,
        allow_private=True,  # the test server is on a private address of the host
    )
    previous = egress_gateway.activate(url, instance)
    try:
        yield instance
    finally:
        remove_workspaces(ctx)
        current = egress_gateway.activate(url, previous)
        for made in {instance, current}:
            if made is not None:
                made.stop()
        client = docker.DockerClient(base_url=url, use_ssh_client=False, timeout=120)
        try:
            for found in client.networks.list(names=[network]):
                interface = firewall.bridge_from(network, found.attrs).interface
                firewall_for(url, client, TEST_LABELS).remove(interface)
                found.remove()
        finally:
            client.close()


def remove_workspaces(ctx: Context) -> None:
    """Destroy the live workspaces, and the containers and volumes that workspaces retired
    without destroying them (a move off a lost host leaves them in place) — idempotent."""
    with ctx.session() as session:
        for workspace in session.scalars(select(Workspace)):
            host = session.get(Host, workspace.host_id) if workspace.host_id else None
            if host is None:
                continue
            if workspace.status is WorkspaceStatus.DESTROYED:
                backend = factory(host)
                try:
                    backend.destroy(workspaces.handle_of(workspace))
                finally:
                    backend.close()  # type: ignore[attr-defined]
            elif workspace.status in workspaces.LIVE:
                workspaces.destroy(session, workspace, factory)


@pytest.fixture
def gateway(ctx: Context) -> Iterator[EgressGateway]:
    """The local engine's gateway (the proxy a mitmdump process of this one)."""
    with gateway_on(ctx, "unix") as instance:
        yield instance


@pytest.fixture
def remote_gateway(ctx: Context) -> Iterator[EgressGateway]:
    """The ssh:// engine's gateway (the proxy a container on that host)."""
    with gateway_on(ctx, "ssh") as instance:
        yield instance


def workspace_row(
    name: str,
    status: WorkspaceStatus,
    *,
    host_id: int | None = None,
    env: dict[str, str] | None = None,
) -> Workspace:
    """A workspace row with no container behind it (what the gateway's bookkeeping reads)."""
    return Workspace(
        purpose=WorkspacePurpose.ATTEMPT,
        backend="docker",
        name=name,
        image="img",
        hardware_profile="cpu",
        host_id=host_id,
        env=env,
        status=status,
    )


def blacklist_attempt(
    ctx: Context,
    tmp_path: Path,
    blacklist: str,
    host_url: str,
    *,
    host_name: str = "local",
    check: bool = True,
    enabled: bool = True,
) -> int:
    """An agent attempt of the demo paper task, its blacklist replaced, in a blacklist study, with
    the host `host_name` at `host_url` (`check` False: marked healthy without the full host check,
    which other tests cover and which costs some 20 s over SSH; `enabled` False: it takes no
    work yet)."""
    folder = tmp_path / "task"
    shutil.copytree(DEMO_PAPER, folder)
    (folder / "blacklist.txt").write_text(blacklist)
    with ctx.session() as session:
        host = workspaces.add_host(session, host_name, host_url, None)
        if check:
            assert workspaces.check_host(session, host).healthy
        else:
            host.healthy = True
        host.enabled = enabled
        task = tasks.import_task(session, BlobStore(ctx.settings.blob_dir), folder).task
        study = studies.create_study(
            session, studies.StudySpec(name="egress", egress_policy="blacklist"), None
        )
        studies.add_task(session, study, task, None)
        session.flush()
        session.refresh(study)
        agent = studies.add_agent(
            session, study, "agent", "basic", "m", "http://127.0.0.1:9/v1", None, None
        )
        return studies.create_attempt(session, agent, task, None).id


def attempt_workspace(ctx: Context, attempt_id: int) -> tuple[int, str, WorkspaceHandle]:
    """The attempt's (only live) workspace: its id, name and handle."""
    with ctx.session() as session:
        workspace = session.scalars(
            select(Workspace).where(
                Workspace.attempt_id == attempt_id, Workspace.status != WorkspaceStatus.DESTROYED
            )
        ).one()
        return workspace.id, workspace.name, workspaces.handle_of(workspace)


def fetch(handle: WorkspaceHandle, url: str, urls: list[str]) -> dict[str, str]:
    """GET each of `urls` inside the workspace on the engine at `url`: url -> status (or
    "error")."""
    backend = DockerBackend.from_url(url, labels=TEST_LABELS)
    try:
        result = backend.exec(handle, ["python3", "-c", CLIENT, *urls], timeout_s=60)
    finally:
        backend.close()
    assert result.exit_code == 0, result.output
    lines = result.output.decode().splitlines()
    return {line.split()[1]: line.split()[0] for line in lines}
