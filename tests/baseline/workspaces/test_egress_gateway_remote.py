"""A blacklist study on an `ssh://` host: egress filtered and logged there exactly as locally.

The attempt is launched the normal way with that host the only one: placement puts the workspace
there and routes it through that host's gateway (the test gives it its labelled network and lets
the proxy reach the test server's private address), which runs the proxy as a container on that
host and installs the firewall there through the Docker API (a helper container). Inside the
workspace the allowed URL answers and the blacklisted one is refused; the scheduler's egress job
pulls the proxy's events back from the container and records them as the workspace's
`EgressEvent` rows; the bridge's chain is on the engine's host and a host service other than the
proxy does not answer the workspace directly. The sshd's engine is this machine's, which is why
servers started here are the remote host's services (and why Docker's default bridge address
reaches them).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from sqlalchemy import select

from baseline.attempts import host_outage, launch
from baseline.attempts.snapshots import HelperSource, resolve_source, take_snapshot
from baseline.context import Context
from baseline.models import (
    Attempt,
    AttemptStatus,
    EgressEvent,
    Host,
    SnapshotKind,
    Workspace,
    WorkspaceStatus,
)
from baseline.runs import driver_clock
from baseline.workspaces import egress_gateway, workspaces
from baseline.workspaces.egress_gateway import EgressGateway
from infra import remote
from infra.docker_backend import DockerBackend
from infra.egress import firewall, setup
from infra.egress.engine_host import EngineHostFirewall
from infra.egress.rules import load_config
from infra.workspace import WorkspaceHandle
from tests.baseline.egress_world import (
    Server,
    attempt_workspace,
    blacklist_attempt,
    factory,
    fetch,
    gateway,
    remote_gateway,
    server,
)
from tests.docker_env import LOCAL_URL, TEST_LABELS, test_image
from tests.ok_http import OkHandler

pytestmark = pytest.mark.docker
__all__ = ["gateway", "remote_gateway", "server", "test_image"]
DEAD_URL = "ssh://root@127.0.0.1:1"  # nothing listens: the probe gets no answer

# Inside the workspace: a direct GET (no proxy), "ok" or the error's class name.
DIRECT = """
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(sys.argv[1], timeout=3) as response:
        print("ok" if response.read() == b"ok" else "wrong")
except Exception as error:
    print(type(getattr(error, "reason", error)).__name__)
"""


@pytest.fixture
def host_service() -> Iterator[int]:
    """A service on all of the host's addresses (so on the egress gateway too): not the proxy."""
    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 0), OkHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


def _exec(handle: WorkspaceHandle, url: str, *argv: str) -> str:
    backend = DockerBackend.from_url(url, labels=TEST_LABELS)
    try:
        result = backend.exec(handle, ["python3", "-c", *argv], timeout_s=60)
    finally:
        backend.close()
    assert result.exit_code == 0, result.output
    return result.output.decode()


@pytest.mark.sqlite_only("the egress proxy on an SSH host")
def test_a_blacklist_study_on_an_ssh_host_is_filtered_and_logged_there(
    ctx: Context,
    remote_gateway: EgressGateway,
    gateway: EgressGateway,
    server: Server,
    host_service: int,
    test_image: str,
    tmp_path: Path,
) -> None:
    url = remote_gateway.docker_url
    allowed, refused = f"{server.base}/open/data.csv", f"{server.base}/blocked/repo/train.py"
    blacklist = f"# test\n{server.base}/blocked/repo\n"
    attempt_id = blacklist_attempt(ctx, tmp_path, blacklist, url, host_name="far", check=False)
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING
    driver_clock.driving_starts(ctx, attempt_id)  # its agent at work when the host is lost
    workspace_id, name, handle = attempt_workspace(ctx, attempt_id)
    with ctx.session() as session:
        workspace = session.get(Workspace, workspace_id)
        assert workspace is not None and workspace.network == remote_gateway.network
        host = session.get(Host, workspace.host_id)
        assert host is not None and host.docker_url == url
        proxy_url = (workspace.env or {})["HTTPS_PROXY"]

    assert fetch(handle, url, [allowed, refused]) == {allowed: "200", refused: "403"}
    assert server.seen == ["/open/data.csv"]
    backend = DockerBackend.from_url(url, labels=TEST_LABELS)
    try:
        bundle = setup.read_file(backend, handle, setup.CA_BUNDLE) or b""
    finally:
        backend.close()
    assert bundle.count(b"BEGIN CERTIFICATE") >= 2  # the proxy's CA, copied back, trusted there

    # The proxy writes an exchange's event after answering it, so the fetch can be back before
    # the event is in the host's log: ingest as the scheduler does, until both are in (CI once
    # ingested an instant too early and found none).
    expected = [
        (workspace_id, "GET", allowed, True, None),
        (workspace_id, "GET", refused, False, f"{server.base}/blocked/repo"),
    ]
    deadline = time.monotonic() + 30
    while True:
        reports = egress_gateway.ingest_job(ctx)
        assert reports is not None and reports[url].invalid == []
        with ctx.session() as session:
            events = session.scalars(select(EgressEvent).order_by(EgressEvent.id)).all()
            seen = [(e.workspace_id, e.method, e.url, e.allowed, e.rule) for e in events]
        if len(seen) >= len(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert seen == expected

    # The firewall is on the engine's host: the chain is there, and a host service on the
    # gateway address other than the proxy does not answer the workspace directly.
    client = docker.DockerClient(base_url=url, use_ssh_client=False, timeout=120)
    try:
        bridge = firewall.bridge_of(client, remote_gateway.network)
        chain = EngineHostFirewall(client, labels=TEST_LABELS).installed(bridge.chain)
    finally:
        client.close()
    assert len(chain) == 3 and chain[-1].endswith("-j DROP"), chain
    around = f"http://{bridge.gateway}:{host_service}/"
    assert _exec(handle, url, DIRECT, around).strip() != "ok"
    kept = json.loads(remote_gateway.listen_path.read_text())
    assert proxy_url.startswith(f"http://{name}:")  # the proxy on the remote host's gateway
    assert proxy_url.endswith(f"@{bridge.gateway}:{kept['port']}")

    # The host is lost and the study moves automatically: the attempt goes to the local host
    # from its latest capture, routed through that host's gateway, and its credentials are
    # revoked on the old host's gateway. (The probe is pointed where nothing answers while the
    # host row keeps its URL, so that the old proxy can show the revocation; what does not reach
    # it is its proxy's container, stopped through the outage.)
    take_snapshot(ctx, attempt_id, SnapshotKind.MANUAL, None, _source(ctx, attempt_id))
    _run_proxy(url, remote_gateway, running=False)
    with ctx.session() as session:  # asserted after it commits: no container unaccounted for
        near = workspaces.add_host(session, "near", LOCAL_URL, None)
        near.healthy = True  # the full check is covered elsewhere
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        attempt.study.outage_move = "automatic"
        report = host_outage.probe_hosts(
            ctx,
            session,
            check=lambda probed: remote.check_host(
                DEAD_URL if probed == url else probed, timeout_s=5
            ),
            backend_factory=factory,
            move_after_s=0,
        )
    assert report.paused == [attempt_id] and report.moved == {attempt_id: "near"}, report
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        old = session.get(Workspace, workspace_id)
        assert attempt is not None and attempt.status is AttemptStatus.RUNNING
        assert old is not None and old.status is WorkspaceStatus.DESTROYED
    moved_id, moved_name, moved = attempt_workspace(ctx, attempt_id)
    with ctx.session() as session:
        workspace = session.get(Workspace, moved_id)
        assert workspace is not None and workspace.network == gateway.network
        local_proxy = (workspace.env or {})["HTTPS_PROXY"]
        assert local_proxy.startswith(f"http://{moved_name}:")
    here = json.loads(gateway.listen_path.read_text())
    assert local_proxy.endswith(f"@{here['host']}:{here['port']}")
    assert name not in load_config((remote_gateway.state_dir / "policies.json").read_text())
    assert moved_name in load_config((gateway.state_dir / "policies.json").read_text())
    assert fetch(moved, LOCAL_URL, [allowed, refused]) == {allowed: "200", refused: "403"}

    # The host's proxy comes back (its restart policy, as after a reboot) with the file it had:
    # the old container, left in place, still gets through until the egress job publishes the
    # revocation; from then on its proxy refuses it (407, not logged).
    _run_proxy(url, remote_gateway, running=True)
    assert _until_answered(handle, url, allowed) == "200"
    reports = egress_gateway.ingest_job(ctx)
    assert reports is not None and reports[LOCAL_URL].invalid == [] and reports[url].invalid == []
    assert fetch(handle, url, [allowed]) == {allowed: "407"}
    assert server.seen == ["/open/data.csv"] * 3
    with ctx.session() as session:
        events = session.scalars(
            select(EgressEvent)
            .join(Workspace, Workspace.id == EgressEvent.workspace_id)
            .where(Workspace.attempt_id == attempt_id)
            .order_by(EgressEvent.id)
        ).all()
        assert [(e.workspace_id, e.url, e.allowed) for e in events] == [
            (workspace_id, allowed, True),
            (workspace_id, refused, False),
            (workspace_id, allowed, True),  # the egress job ingests ssh:// before unix://
            (moved_id, allowed, True),
            (moved_id, refused, False),
        ]

    # A proxy found stopped (crashed, or stopped as here) is still removed: its last events are
    # copied out of the stopped container (exec needs a running one) instead of failing.
    _run_proxy(url, remote_gateway, running=False)
    remote_gateway.stop()
    client = docker.DockerClient(base_url=url, use_ssh_client=False, timeout=120)
    try:
        assert (
            client.containers.list(all=True, filters={"name": remote_gateway.container_name}) == []
        )
    finally:
        client.close()


def _source(ctx: Context, attempt_id: int) -> HelperSource:
    """The capture the move restores from, taken the scheduler's way (on the host, ssh://)."""
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        source = resolve_source(session, attempt)
    assert isinstance(source, HelperSource)
    return source


def _run_proxy(url: str, gateway: EgressGateway, *, running: bool) -> None:
    """Stop or start the gateway's proxy container behind its back (the restart policy's way)."""
    client = docker.DockerClient(base_url=url, use_ssh_client=False, timeout=120)
    try:
        container = client.containers.get(gateway.container_name)
        if running:
            container.start()
        else:
            container.stop(timeout=2)
    finally:
        client.close()


def _until_answered(handle: WorkspaceHandle, url: str, target: str) -> str:
    """The status of a GET through the proxy once the proxy answers (it is starting)."""
    deadline = time.monotonic() + 30
    while True:
        got = fetch(handle, url, [target])[target]
        if got != "error" or time.monotonic() > deadline:
            return got
        time.sleep(0.5)
