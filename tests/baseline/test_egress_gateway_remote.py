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
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from sqlalchemy import select

from baseline import egress_gateway, launch, workspaces
from baseline.context import Context
from baseline.egress_gateway import EgressGateway
from baseline.models import AttemptStatus, EgressEvent, Host, Workspace
from infra.docker_backend import DockerBackend
from infra.egress import firewall, setup
from infra.egress.engine_host import EngineHostFirewall
from infra.egress.proxy import EgressProxyError, find_mitmdump
from infra.workspace import WorkspaceHandle
from tests.baseline.test_egress_gateway import (
    CLIENT,
    Handler,
    Server,
    _blacklist_attempt,
    _workspace,
    factory,
    server,
)
from tests.docker_env import TEST_LABELS, docker_url, new_name, test_image, unavailable

pytestmark = pytest.mark.docker
__all__ = ["server", "test_image"]

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
def remote_gateway(ctx: Context) -> Iterator[EgressGateway]:
    """The gateway this process uses for the ssh:// engine, on a test network, in that host's
    state dir; all of it removed after."""
    url = docker_url("ssh")
    try:
        find_mitmdump()  # the proxy image is made from the egress venv
    except EgressProxyError as exc:
        unavailable(str(exc))
    network = new_name("bl-test-regress")
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
        with ctx.session() as session:
            for workspace in workspaces.live_workspaces(session):
                workspaces.destroy(session, workspace, factory)
        egress_gateway.activate(url, previous)
        instance.stop()
        client = docker.DockerClient(base_url=url, use_ssh_client=False, timeout=120)
        try:
            for found in client.networks.list(names=[network]):
                interface = firewall.bridge_from(network, found.attrs).interface
                EngineHostFirewall(client, labels=TEST_LABELS).remove(interface)
                found.remove()
        finally:
            client.close()


@pytest.fixture
def host_service() -> Iterator[int]:
    """A service on all of the host's addresses (so on the egress gateway too): not the proxy."""
    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 0), type("Any", (Handler,), {"seen": []}))
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


def test_a_blacklist_study_on_an_ssh_host_is_filtered_and_logged_there(
    ctx: Context,
    remote_gateway: EgressGateway,
    server: Server,
    host_service: int,
    test_image: str,
    tmp_path: Path,
) -> None:
    url = remote_gateway.docker_url
    allowed, refused = f"{server.base}/open/data.csv", f"{server.base}/blocked/repo/train.py"
    blacklist = f"# test\n{server.base}/blocked/repo\n"
    attempt_id = _blacklist_attempt(ctx, tmp_path, blacklist, host_url=url, check=False)
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING
    workspace_id, name, handle = _workspace(ctx, attempt_id)
    with ctx.session() as session:
        workspace = session.get(Workspace, workspace_id)
        assert workspace is not None and workspace.network == remote_gateway.network
        host = session.get(Host, workspace.host_id)
        assert host is not None and host.docker_url == url
        proxy_url = (workspace.env or {})["HTTPS_PROXY"]

    lines = _exec(handle, url, CLIENT, allowed, refused).splitlines()
    assert {line.split()[1]: line.split()[0] for line in lines} == {allowed: "200", refused: "403"}
    assert server.seen == ["/open/data.csv"]
    backend = DockerBackend.from_url(url, labels=TEST_LABELS)
    try:
        bundle = setup.read_file(backend, handle, setup.CA_BUNDLE) or b""
    finally:
        backend.close()
    assert bundle.count(b"BEGIN CERTIFICATE") >= 2  # the proxy's CA, copied back, trusted there

    reports = egress_gateway.ingest_job(ctx)
    assert reports is not None and reports[url].invalid == []
    with ctx.session() as session:
        events = session.scalars(select(EgressEvent).order_by(EgressEvent.id)).all()
        assert [(e.workspace_id, e.method, e.url, e.allowed, e.rule) for e in events] == [
            (workspace_id, "GET", allowed, True, None),
            (workspace_id, "GET", refused, False, f"{server.base}/blocked/repo"),
        ]

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
