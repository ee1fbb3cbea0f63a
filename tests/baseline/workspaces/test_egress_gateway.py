"""Launched attempts reach out only through the egress gateway, on the real dockerd and mitmdump.

A blacklist study of a paper task (the demo task, its blacklist pointing at a server on this
machine's Docker bridge), launched while no host takes work: its workspace stays PENDING, and the
scheduler's reconcile places it later, routed through the gateway of the host it lands on. Inside
the workspace the allowed URL answers, the blacklisted one is refused, both requests become
`EgressEvent` rows of the workspace, and the workspace keeps its egress across a restart of the
gateway and of its container. (Routing at launch time is shown on an ssh:// host,
`test_egress_gateway_remote.py`.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import select

from baseline.attempts import launch
from baseline.context import Context
from baseline.models import AttemptStatus, EgressEvent, Host, Workspace, WorkspaceStatus
from baseline.workspaces import egress_gateway, workspaces
from baseline.workspaces.egress_gateway import EgressGateway, EgressUnavailable
from infra.docker_backend import DockerBackend
from infra.egress import setup
from infra.egress.proxy import EgressProxy
from infra.egress.rules import load_config
from infra.workspace import WorkspaceHandle
from tests.baseline.egress_world import (
    Server,
    attempt_workspace,
    blacklist_attempt,
    factory,
    fetch,
    gateway,
    server,
    workspace_row,
)
from tests.docker_env import LOCAL_URL, TEST_LABELS, test_image

pytestmark = pytest.mark.docker
__all__ = ["gateway", "server", "test_image"]


def _has_proxy_ca(handle: WorkspaceHandle) -> bool:
    backend = DockerBackend.from_url(LOCAL_URL, labels=TEST_LABELS)
    try:
        bundle = setup.read_file(backend, handle, setup.CA_BUNDLE) or b""
    finally:
        backend.close()
    return bundle.count(b"BEGIN CERTIFICATE") >= 2  # the image's CAs and the proxy's


@pytest.mark.sqlite_only("the workspace's egress proxy")
def test_blacklisted_url_is_refused_inside_the_workspace_and_recorded(
    ctx: Context, gateway: EgressGateway, server: Server, test_image: str, tmp_path: Path
) -> None:
    allowed, refused = f"{server.base}/open/data.csv", f"{server.base}/blocked/repo/train.py"
    blacklist = f"# test\n{server.base}/blocked/repo\n"
    attempt_id = blacklist_attempt(ctx, tmp_path, blacklist, LOCAL_URL, enabled=False)
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.PENDING  # no host takes work: nothing routed, nothing made
    workspace_id, name, _ = attempt_workspace(ctx, attempt_id)
    with ctx.session() as session:
        workspace = session.get(Workspace, workspace_id)
        assert workspace is not None and workspace.status is WorkspaceStatus.PENDING
        assert workspace.network == "none" and workspace.env is None
        for host in session.scalars(select(Host)):
            host.enabled = True
    assert not gateway.state_dir.exists() or name not in load_config(
        (gateway.state_dir / "policies.json").read_text()
    )

    # The scheduler's reconcile (what `reconcile_job` runs, with this test's backends) places
    # it, routed through the gateway of the host it lands on; the periodic launch job starts it.
    with ctx.session() as session:
        report = workspaces.reconcile(session, factory, router=egress_gateway.router(ctx))
        assert report.placed == [name], report
    # The process that placed it ended, and its proxy with it (a CLI command's, issue 36 item
    # 6): the attempt's first requests failed to connect. Its proxy listens before it starts.
    gateway.stop()
    assert launch.start_placed_attempts(ctx, factory) == [attempt_id]
    _, _, handle = attempt_workspace(ctx, attempt_id)
    with ctx.session() as session:
        workspace = session.get(Workspace, workspace_id)
        assert workspace is not None and workspace.network == gateway.network
        assert workspace.env is not None and f"{name}:" in workspace.env["HTTPS_PROXY"]
    assert name in load_config((gateway.state_dir / "policies.json").read_text())
    assert _has_proxy_ca(handle)

    assert fetch(handle, LOCAL_URL, [allowed, refused]) == {allowed: "200", refused: "403"}
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
    assert fetch(handle, LOCAL_URL, [allowed, refused]) == {allowed: "200", refused: "403"}

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
    attempt_id = blacklist_attempt(ctx, tmp_path, "none\n", LOCAL_URL)
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
            session.add(workspace_row(name, status))
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
            proxy = {"HTTPS_PROXY": f"http://{name}:t@10.0.0.1:1"}
            session.add(workspace_row(name, status, host_id=host_id, env=proxy))
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


def test_a_revocation_for_a_host_that_does_not_answer_is_kept_here_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A proxied workspace retired while its ssh:// host is lost (a move): its credentials leave
    the policy file here at once, which the host's proxy is given once it answers (the egress
    job), and not reaching the host is only logged."""
    down = "ssh://nobody@127.0.0.1:1"
    gateway = EgressGateway(tmp_path / "egress", docker_url=down)
    policies = EgressProxy(gateway.state_dir)
    policies.register("ws-lost", "blacklist")
    policies.register("ws-kept", "open")
    proxy = {"HTTPS_PROXY": "http://ws-lost:t@10.0.0.1:1"}
    workspace = workspace_row("ws-lost", WorkspaceStatus.RUNNING, env=proxy)
    previous = egress_gateway.activate(down, gateway)
    try:
        egress_gateway.after_destroy(workspace, Host(name="lost", docker_url=down))
    finally:
        egress_gateway.activate(down, previous)
    assert list(load_config(policies.config_path.read_text())) == ["ws-kept"]
    assert f"egress policy of ws-lost not sent to {down}" in caplog.text
