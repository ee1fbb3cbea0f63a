"""`baseline workspace reconcile` does at once what the scheduler does every minute: it destroys
disposable workspaces no job holds (`grading_recovery.sweep`) and places pending workspaces on
the route of the host they land on (`workspaces.reconcile_job`). It did neither: the sweep ran
only in the scheduler, and its placements had no egress route, so an open or blacklist study's
workspace it placed got no network.

SQLite-only and without Docker: every host's backend is `FakeEngine`."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from baseline.cli import cli
from baseline.context import Context
from baseline.grading import family_environment
from baseline.models import (
    Host,
    JobStatus,
    Reproduction,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.workspaces import backends, egress_gateway
from baseline.workspaces.workspaces import request_workspace
from infra.family_run import scoring_run_name
from tests.baseline.fake_engine import FakeEngine
from tests.scoring.scoring_world import build_world, snapshot_reference

pytestmark = pytest.mark.sqlite_only("what one command does to rows, on a fake engine")


@pytest.fixture
def engine(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    """The backend of every host; the command runs on `ctx`."""
    fake = FakeEngine(name="fake")  # not "docker": no terminal recorder to start in it
    monkeypatch.setattr(backends.DockerBackend, "from_url", lambda *_args, **_kwargs: fake)
    monkeypatch.setattr(Context, "from_settings", classmethod(lambda _cls: ctx))
    return fake


def _reconcile() -> str:
    result = CliRunner().invoke(cli, ["workspace", "reconcile", "--no-restart"])
    assert result.exit_code == 0, result.output
    return result.output


def _workspace(ctx: Context, name: str) -> Workspace:
    with ctx.session() as session:
        workspace = session.scalar(select(Workspace).where(Workspace.name == name))
        assert workspace is not None
        return workspace


def test_reconcile_destroys_a_disposable_workspace_its_ended_job_left(
    ctx: Context, engine: FakeEngine, tmp_path: Path
) -> None:
    world = build_world(ctx, image_digest="sha256:" + "a" * 64)
    snapshot_id = snapshot_reference(ctx, world.attempt_id, tmp_path / "ref")
    with ctx.session() as session:
        session.add(Host(name="engine", docker_url="unix:///run/engine.sock", healthy=True))
        session.flush()
        left = request_workspace(
            session, image="img", hardware_profile="cpu",
            purpose=WorkspacePurpose.REPRODUCTION, backend_factory=engine.factory,
        )  # fmt: skip
        name = left.name
        session.add(
            Reproduction(
                snapshot_id=snapshot_id, status=JobStatus.FAILED, details={"workspace": name}
            )
        )
    output = _reconcile()
    assert f"destroyed {name} (a disposable workspace no job holds)" in output
    assert _workspace(ctx, name).status is WorkspaceStatus.DESTROYED


def test_reconcile_places_a_pending_workspace_on_its_hosts_egress_route(
    ctx: Context, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    routed: list[str] = []

    def router(_ctx: Context) -> egress_gateway.Router:
        def route(_session: object, workspace: Workspace, host: Host) -> egress_gateway.Route:
            routed.append(f"{workspace.name} on {host.name}")
            return egress_gateway.Route(network="bl-egress", env={"NO_PROXY": "localhost"})

        return route

    monkeypatch.setattr(egress_gateway, "router", router)
    with ctx.session() as session:  # no host yet: it waits
        pending = request_workspace(
            session, image="img", hardware_profile="cpu", backend_factory=engine.factory
        )
        name = pending.name
        assert pending.status is WorkspaceStatus.PENDING
        session.add(Host(name="engine", docker_url="unix:///run/engine.sock", healthy=True))
    assert f"placed {name}" in _reconcile()
    placed = _workspace(ctx, name)
    assert routed == [f"{name} on engine"]
    assert (placed.status, placed.network) == (WorkspaceStatus.RUNNING, "bl-egress")
    assert placed.env == {"NO_PROXY": "localhost"}


def test_reconcile_says_why_a_workspace_still_waits(ctx: Context, engine: FakeEngine) -> None:
    """A proxied workspace needs its host's egress proxy, which the scheduler's process runs:
    the command leaves it pending for the scheduler, and says so (it said nothing)."""
    with ctx.session() as session:
        pending = request_workspace(
            session, image="img", hardware_profile="cpu", backend_factory=engine.factory,
            env={"HTTPS_PROXY": "http://proxy:3128"},
        )  # fmt: skip
        name = pending.name
        session.add(Host(name="engine", docker_url="unix:///run/engine.sock", healthy=True))
    output = _reconcile()
    assert f"pending {name}: engine: {name}: workspace {name} uses the egress proxy" in output
    assert _workspace(ctx, name).status is WorkspaceStatus.PENDING


def test_reconcile_names_a_family_scoring_run_it_removed_as_such(
    ctx: Context, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep also removes the families' scoring runs no running row names
    (`family_environment.sweep_scoring_runs`); the command says so, not that a workspace went."""
    name = scoring_run_name()
    monkeypatch.setattr(family_environment, "sweep_scoring_runs", lambda *_args, **_kwargs: [name])
    assert f"removed {name} (a family's scoring run no job holds)" in _reconcile()
