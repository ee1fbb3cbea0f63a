"""Launched attempts reach out only through the egress gateway, on the real dockerd and mitmdump.

A blacklist study of a paper task (the demo task, its blacklist pointing at a server on this
machine's Docker bridge): inside the workspace the allowed URL answers, the blacklisted one is
refused, both requests become `EgressEvent` rows of the
workspace, and the workspace keeps its egress across a restart of the gateway and of its container.
"""

from __future__ import annotations

import http.server
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from sqlalchemy import select

from baseline import egress_gateway, launch, studies, tasks, workspaces
from baseline.context import Context
from baseline.egress_gateway import EgressGateway, EgressUnavailable
from baseline.models import (
    AttemptStatus,
    EgressEvent,
    Host,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from infra.blobs import BlobStore
from infra.docker_backend import DockerBackend
from infra.egress import firewall, setup
from infra.egress.proxy import EgressProxy, EgressProxyError, find_mitmdump
from infra.egress.rules import load_config
from infra.workspace import WorkspaceBackend, WorkspaceHandle
from tests.docker_env import (
    LOCAL_URL,
    TEST_LABELS,
    default_bridge_address,
    docker_url,
    new_name,
    test_image,
    unavailable,
)

pytestmark = pytest.mark.docker
__all__ = ["test_image"]

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


class Handler(http.server.BaseHTTPRequestHandler):
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        return


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
        (address, 0), type("Recorder", (Handler,), {"seen": seen})
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield Server(f"http://{address}:{httpd.server_address[1]}", seen)
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def gateway(ctx: Context) -> Iterator[EgressGateway]:
    """This process's gateway on a test-labelled network; everything removed afterwards."""
    docker_url("unix")
    try:
        find_mitmdump()
    except EgressProxyError as exc:
        unavailable(str(exc))
    network = new_name("bl-test-egress")
    instance = EgressGateway(
        egress_gateway.state_dir(ctx.settings, LOCAL_URL),
        docker_url=LOCAL_URL,
        network=network,
        labels=TEST_LABELS,
        allow_private=True,  # the test server is on a private address of this machine
    )
    previous = egress_gateway.activate(LOCAL_URL, instance)
    try:
        yield instance
    finally:
        with ctx.session() as session:
            for workspace in workspaces.live_workspaces(session):
                workspaces.destroy(session, workspace, factory)
        current = egress_gateway.activate(LOCAL_URL, previous)
        for made in {instance, current}:
            if made is not None:
                made.stop()
        client = docker.DockerClient(base_url=LOCAL_URL, use_ssh_client=False)
        try:
            for found in client.networks.list(names=[network]):
                firewall.remove(firewall.bridge_from(network, found.attrs).interface)
                found.remove()
        finally:
            client.close()


def _blacklist_attempt(
    ctx: Context, tmp_path: Path, blacklist: str, host_url: str = LOCAL_URL, *, check: bool = True
) -> int:
    """An agent attempt of the demo paper task, its blacklist replaced, in a blacklist study, with
    the one host at `host_url` (`check` False: marked healthy without the full host check, which
    other tests cover and which costs some 20 s over SSH)."""
    folder = tmp_path / "task"
    shutil.copytree(DEMO_PAPER, folder)
    (folder / "blacklist.txt").write_text(blacklist)
    with ctx.session() as session:
        host = workspaces.add_host(session, "local", host_url, None)
        if check:
            assert workspaces.check_host(session, host).healthy
        else:
            host.healthy = True
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


def _workspace(ctx: Context, attempt_id: int) -> tuple[int, str, WorkspaceHandle]:
    with ctx.session() as session:
        workspace = session.scalars(
            select(Workspace).where(Workspace.attempt_id == attempt_id)
        ).one()
        return workspace.id, workspace.name, workspaces.handle_of(workspace)


def _fetch(handle: WorkspaceHandle, urls: list[str]) -> dict[str, str]:
    backend = DockerBackend.from_url(LOCAL_URL, labels=TEST_LABELS)
    try:
        result = backend.exec(handle, ["python3", "-c", CLIENT, *urls], timeout_s=60)
    finally:
        backend.close()
    assert result.exit_code == 0, result.output
    lines = result.output.decode().splitlines()
    return {line.split()[1]: line.split()[0] for line in lines}


def _has_proxy_ca(handle: WorkspaceHandle) -> bool:
    backend = DockerBackend.from_url(LOCAL_URL, labels=TEST_LABELS)
    try:
        bundle = setup.read_file(backend, handle, setup.CA_BUNDLE) or b""
    finally:
        backend.close()
    return bundle.count(b"BEGIN CERTIFICATE") >= 2  # the image's CAs and the proxy's


def test_blacklisted_url_is_refused_inside_the_workspace_and_recorded(
    ctx: Context, gateway: EgressGateway, server: Server, test_image: str, tmp_path: Path
) -> None:
    allowed, refused = f"{server.base}/open/data.csv", f"{server.base}/blocked/repo/train.py"
    attempt_id = _blacklist_attempt(ctx, tmp_path, f"# test\n{server.base}/blocked/repo\n")
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING
    workspace_id, name, handle = _workspace(ctx, attempt_id)
    with ctx.session() as session:
        workspace = session.get(Workspace, workspace_id)
        assert workspace is not None and workspace.network == gateway.network
        assert workspace.env is not None and f"{name}:" in workspace.env["HTTPS_PROXY"]
    assert _has_proxy_ca(handle)

    assert _fetch(handle, [allowed, refused]) == {allowed: "200", refused: "403"}
    assert server.seen == ["/open/data.csv"]

    reports = egress_gateway.ingest_job(ctx)
    assert reports is not None and reports[LOCAL_URL].invalid == []
    with ctx.session() as session:
        events = session.scalars(select(EgressEvent).order_by(EgressEvent.id)).all()
        assert [(e.workspace_id, e.method, e.url, e.allowed, e.rule) for e in events] == [
            (workspace_id, "GET", allowed, True, None),
            (workspace_id, "GET", refused, False, f"{server.base}/blocked/repo"),
        ]

    # A portal restart: a new gateway on the same state keeps the address and the credentials;
    # a lost container comes back from the stored env, the proxy's CA installed again.
    gateway.stop()
    restarted = EgressGateway(
        gateway.state_dir,
        docker_url=LOCAL_URL,
        network=gateway.network,
        labels=TEST_LABELS,
        allow_private=True,
    )
    egress_gateway.activate(LOCAL_URL, restarted)
    restarted.ensure_running()
    backend = DockerBackend.from_url(LOCAL_URL, labels=TEST_LABELS)
    try:
        backend.destroy(handle, keep_submission=True)
    finally:
        backend.close()
    with ctx.session() as session:
        workspace = session.get(Workspace, workspace_id)
        assert workspace is not None
        workspaces.restart(session, workspace, factory)
        handle = workspaces.handle_of(workspace)
    assert _has_proxy_ca(handle)
    assert _fetch(handle, [allowed, refused]) == {allowed: "200", refused: "403"}

    with ctx.session() as session:
        workspace = session.get(Workspace, workspace_id)
        assert workspace is not None
        workspaces.destroy(session, workspace, factory)
        assert workspace.status is WorkspaceStatus.DESTROYED
    policies = load_config((gateway.state_dir / "policies.json").read_text())
    assert name not in policies


def test_proxied_egress_on_a_host_whose_engine_does_not_answer_is_refused_with_a_reason(
    ctx: Context, gateway: EgressGateway, tmp_path: Path
) -> None:
    """The route is the gateway of the host placement chose: one that cannot be reached there
    refuses the launch, naming the engine, and leaves no workspace behind."""
    attempt_id = _blacklist_attempt(ctx, tmp_path, "none\n")
    unreachable = "ssh://someone@remote.invalid"
    with ctx.session() as session:
        for host in session.scalars(select(Host)):
            host.docker_url = unreachable
    with pytest.raises(EgressUnavailable, match=re.escape(f"Docker Engine at {unreachable}")):
        launch.launch(ctx, attempt_id, None, image="unused", backend_factory=factory)
    egress_gateway.activate(unreachable, None)  # the gateway made for it
    with ctx.session() as session:
        assert session.scalars(select(Workspace)).all() == []


def test_prune_revokes_the_credentials_of_workspaces_destroyed_elsewhere(
    ctx: Context, tmp_path: Path
) -> None:
    """A workspace destroyed by another process (the CLI) loses its proxy policy at the next job."""
    gateway = EgressGateway(tmp_path / "egress")
    policies = EgressProxy(gateway.state_dir)
    with ctx.session() as session:
        for name, status in (
            ("ws-gone", WorkspaceStatus.DESTROYED),
            ("ws-live", WorkspaceStatus.RUNNING),
        ):
            policies.register(name, "open")
            session.add(
                Workspace(
                    purpose=WorkspacePurpose.ATTEMPT,
                    backend="docker",
                    name=name,
                    image="img",
                    hardware_profile="cpu",
                    status=status,
                )
            )
        policies.register("ws-being-launched", "blacklist")  # its row is not committed yet
        session.flush()
        assert gateway.prune(session) == ["ws-gone"]
    assert sorted(load_config(policies.config_path.read_text())) == [
        "ws-being-launched",
        "ws-live",
    ]


def test_the_egress_job_records_each_hosts_events_though_another_host_does_not_answer(
    ctx: Context, caplog: pytest.LogCaptureFixture
) -> None:
    """One gateway per host: a host whose engine does not answer (its proxy cannot be kept up,
    its events not pulled) is logged, and another host's events are still recorded."""
    here, down = "unix:///run/baseline-test-here.sock", "ssh://nobody@127.0.0.1:1"
    gateway = EgressGateway(egress_gateway.state_dir(ctx.settings, here), docker_url=here)
    gateway.state_dir.mkdir(parents=True)
    egress_gateway.state_dir(ctx.settings, down).mkdir(parents=True)
    gateway.log_path.write_text(
        '{"at": "2026-01-01T00:00:00Z", "workspace": "ws-here", "method": "GET", '
        '"url": "https://example.org/", "allowed": true}\n'
    )
    with ctx.session() as session:
        lost = workspaces.add_host(session, "lost", down, None)
        for name, host_id, status in (
            ("ws-here", None, WorkspaceStatus.DESTROYED),
            ("ws-down", lost.id, WorkspaceStatus.RUNNING),
        ):
            session.add(
                Workspace(
                    purpose=WorkspacePurpose.ATTEMPT,
                    backend="docker",
                    name=name,
                    image="img",
                    hardware_profile="cpu",
                    host_id=host_id,
                    env={"HTTPS_PROXY": f"http://{name}:t@10.0.0.1:1"},
                    status=status,
                )
            )
    previous = egress_gateway.activate(here, gateway)
    try:
        reports = egress_gateway.ingest_job(ctx)
    finally:
        egress_gateway.activate(here, previous)
        egress_gateway.activate(down, None)  # the gateway the job made for the lost host
    assert reports is not None and reports[here].ingested == 1
    assert f"egress proxy of {down}" in caplog.text
    with ctx.session() as session:
        events = session.scalars(select(EgressEvent)).all()
        assert [(e.url, e.allowed) for e in events] == [("https://example.org/", True)]
