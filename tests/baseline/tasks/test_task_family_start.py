"""What a family's start gets of its workspace: as in Vivaria, where start runs in the task's own
environment, the workspace's GPUs always, and its network and egress proxy (environment, CA) only
when the task asks for ``full_internet``; never more than the workspace has.

The unit tests record the setup container's creation on a fake engine (no GPU exists here): the
workspace's rows (its network, env, GPU assignments) are written by hand. The Docker test runs a
family whose start downloads a file from a server on this machine, through the egress proxy of
an ``open`` study, and the same family without ``full_internet``, whose start cannot reach it.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import docker
import pytest
from docker.errors import NotFound
from sqlalchemy import select

from baseline.attempts import family_launch, launch
from baseline.context import Context
from baseline.models import (
    Attempt,
    AttemptStatus,
    EgressPolicy,
    Host,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.workspaces import egress_gateway, workspaces
from baseline.workspaces.egress_gateway import EgressGateway
from infra.docker_backend import NO_DNS, DockerBackend
from infra.egress import setup
from infra.egress.network import ISOLATED_OPTIONS
from infra.family_run import MODE_DIR
from infra.workspace import ExecResult, OutputSink, WorkspaceBackend, WorkspaceHandle
from scoring.task_standard import AGENT_HOME
from tests.baseline.egress_world import Server, gateway, server
from tests.baseline.tasks.family_world import family_attempt, hold_gpus
from tests.baseline.tasks.test_task_families import (
    _exec,
    _study_with,
    factory,
    local_host,
    write_family,
)
from tests.docker_env import test_image

__all__ = ["gateway", "local_host", "server", "test_image"]

EGRESS_NETWORK = "bl-egress-under-test"
PROXY_URL = "http://ws-a1-start:secret@10.213.0.1:8080"
PROXY_CA = b"-----BEGIN CERTIFICATE-----\nproxy\n-----END CERTIFICATE-----\n"
SYSTEM_CAS = b"-----BEGIN CERTIFICATE-----\nimage\n-----END CERTIFICATE-----\n"


def _tar(name: str, data: bytes | None = None) -> bytes:
    """A tar holding one entry `name`: a file of `data`, or a directory when None."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        if data is None:
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        else:
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class SetupContainer:
    """Start's setup container: start exits 0 having changed nothing, /home/agent empty."""

    short_id = "setup"

    def __init__(self) -> None:
        self.archives: list[tuple[str, bytes]] = []

    def put_archive(self, path: str, data: bytes) -> bool:
        self.archives.append((path, data))
        return True

    def start(self) -> None:
        return None

    def wait(self, timeout: float) -> dict[str, int]:
        return {"StatusCode": 0}

    def logs(self, stdout: bool, stderr: bool) -> bytes:
        return b""

    def diff(self) -> list[dict[str, Any]]:
        return []

    def get_archive(self, path: str) -> tuple[Iterator[bytes], dict[str, int]]:
        assert path == AGENT_HOME
        return iter([_tar("agent")]), {"mode": MODE_DIR | 0o755}

    def remove(self, force: bool) -> None:
        return None


class Engine:
    """The engine as start's setup container's creation and the network's lookup see it."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.container = SetupContainer()
        self.client = MagicMock(spec=docker.DockerClient)
        self.client.api = None
        self.client.containers.create.side_effect = self._create
        self.client.networks.get.side_effect = self._network

    def _create(self, image: str, command: list[str], **options: Any) -> SetupContainer:
        self.created.append(options)
        return self.container

    def _network(self, name: str) -> SimpleNamespace:
        if name != EGRESS_NETWORK:
            raise NotFound(f"network {name} not found")
        attrs = {"Driver": "bridge", "Internal": True, "Options": dict(ISOLATED_OPTIONS)}
        return SimpleNamespace(attrs=attrs)


class WorkspaceOnEngine(DockerBackend):
    """The Docker backend on `Engine`; the workspace container's own files are the egress
    proxy's CA and the image's CA bundle, as the gateway's install left them."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine.client, local=True)
        self.files = {setup.PROXY_CA: PROXY_CA, setup.SYSTEM_BUNDLE: SYSTEM_CAS}

    def put_archive(self, handle: WorkspaceHandle, path: str, archive: Any) -> None:
        return None

    def get_archive(self, handle: WorkspaceHandle, path: str) -> bytes:
        if path not in self.files:
            raise FileNotFoundError(path)
        return _tar(path.rsplit("/", 1)[-1], self.files[path])

    def exec(
        self,
        handle: WorkspaceHandle,
        command: Sequence[str],
        *,
        timeout_s: float | None = None,
        user: str | None = None,
        workdir: str | None = None,
        on_output: OutputSink | None = None,
        max_output_bytes: int = 0,
    ) -> ExecResult:
        return ExecResult(exit_code=0, output=b"1000\n1000\n", timed_out=False, duration_s=0.0)

    def close(self) -> None:
        return None


def _family_attempt(
    ctx: Context,
    *,
    permissions: Sequence[str],
    egress: str,
    network: str = "none",
    env: dict[str, str] | None = None,
    gpus: Sequence[int] = (),
) -> int:
    """An attempt of a family task whose workspace runs (as its rows say) on `network` with
    `env`, holding the GPUs `gpus`."""
    with ctx.session() as session:
        host = Host(name="gpu-host", docker_url="unix:///var/run/docker.sock", healthy=True)
        standard = {"family": "fetcher", "task": "main", "permissions": list(permissions)}
        attempt = family_attempt(
            session,
            host,
            family="fetcher",
            scoring={"task_standard": standard},
            profile="cpu",
            egress=EgressPolicy(egress),
            status=AttemptStatus.READY,
        )
        workspace = Workspace(
            attempt_id=attempt.id,
            purpose=WorkspacePurpose.ATTEMPT,
            host_id=host.id,
            backend="docker",
            name=f"ws-a{attempt.id}-start",
            container_id="workspace-container",
            image="baseline-family:fetcher",
            image_digest="sha256:" + "f" * 64,
            hardware_profile="cpu",
            network=network,
            env=env,
            status=WorkspaceStatus.RUNNING,
        )
        session.add(workspace)
        session.flush()
        hold_gpus(session, workspace, gpus)
        return attempt.id


def _start(ctx: Context, attempt_id: int) -> tuple[dict[str, Any], SetupContainer]:
    """Run the attempt's start on the fake engine: the setup container's create options."""
    engine = Engine()

    def backend_factory(_host: Host) -> WorkspaceBackend:
        return WorkspaceOnEngine(engine)

    family_launch.run_start(ctx, attempt_id, backend_factory)
    (options,) = engine.created
    return options, engine.container


@pytest.mark.sqlite_only("the setup container's create options")
def test_a_full_internet_start_joins_the_workspaces_network_through_its_proxy(
    ctx: Context,
) -> None:
    env = setup.environment(PROXY_URL)
    attempt_id = _family_attempt(
        ctx, permissions=["full_internet"], egress="open", network=EGRESS_NETWORK, env=env
    )
    options, container = _start(ctx, attempt_id)
    assert options.get("network_mode") == EGRESS_NETWORK
    assert options.get("network_disabled") is not True
    assert options["dns"] == [NO_DNS]  # as the workspace's: names resolve only via the proxy
    assert options["environment"] == env
    assert options["environment"]["HTTPS_PROXY"] == PROXY_URL
    assert options["cap_add"] == list(family_launch.START_CAPABILITIES)
    # It trusts the proxy's CA as the workspace does: the CA, the bundle and pip's config are
    # put in before it starts, readable by the agent user start may run commands as.
    trusted = {}
    for path, archive in container.archives:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            for member in tar.getmembers():
                extracted = tar.extractfile(member)
                if extracted is not None:
                    trusted[f"{path.rstrip('/')}/{member.name}"] = (member.mode, extracted.read())
    assert trusted[setup.PROXY_CA] == (0o644, PROXY_CA)
    assert trusted[setup.CA_BUNDLE] == (0o644, SYSTEM_CAS + PROXY_CA)
    assert trusted["/etc/pip.conf"][1] == setup.pip_conf().encode()


@pytest.mark.sqlite_only("the setup container's create options")
def test_a_start_without_full_internet_has_no_network(ctx: Context) -> None:
    attempt_id = _family_attempt(ctx, permissions=[], egress="none")
    options, container = _start(ctx, attempt_id)
    assert options["network_disabled"] is True
    assert "network_mode" not in options
    assert not options.get("environment")
    assert container.archives == []  # no proxy to trust


@pytest.mark.sqlite_only("the setup container's create options")
def test_a_start_never_gets_more_network_than_its_workspace(ctx: Context) -> None:
    """A workspace with no network (e.g. an open study's workspace placed without routing)
    gives its full_internet start none either."""
    attempt_id = _family_attempt(ctx, permissions=["full_internet"], egress="open")
    options, _ = _start(ctx, attempt_id)
    assert options["network_disabled"] is True
    assert "network_mode" not in options


@pytest.mark.sqlite_only("the setup container's create options")
def test_a_start_gets_the_gpus_of_its_workspace(ctx: Context) -> None:
    attempt_id = _family_attempt(ctx, permissions=[], egress="none", gpus=[3, 1])
    options, _ = _start(ctx, attempt_id)
    (request,) = options.get("device_requests", [])
    assert request["DeviceIDs"] == ["1", "3"]  # the workspace's, as its spec lists them
    assert request["Capabilities"] == [["gpu"]] and request["Driver"] == "nvidia"


@pytest.mark.sqlite_only("the setup container's create options")
def test_a_start_of_a_workspace_without_gpus_gets_none(ctx: Context) -> None:
    attempt_id = _family_attempt(ctx, permissions=[], egress="none")
    options, _ = _start(ctx, attempt_id)
    assert not options.get("device_requests")


# -- real Docker --------------------------------------------------------------------------------


def _fetching_family(tmp_path: Path, name: str, url: str, permissions: tuple[str, ...]) -> Path:
    """A family whose start downloads `url` (urllib honours the proxy's env) to the agent."""
    fetch = (
        "import urllib.request; "
        f'Path("/home/agent/fetched.txt").write_bytes(urllib.request.urlopen("{url}", '
        "timeout=20).read())"
    )
    return write_family(tmp_path, name=name, start=fetch, permissions=permissions)


@pytest.mark.docker
@pytest.mark.sqlite_only("the family's start through the egress proxy")
def test_a_full_internet_start_downloads_through_the_proxy_and_one_without_cannot(
    ctx: Context,
    tmp_path: Path,
    test_image: str,
    local_host: None,
    gateway: EgressGateway,
    server: Server,
) -> None:
    url = f"{server.base}/dataset/train.csv"
    folder = _fetching_family(tmp_path, "fetchon", url, ("full_internet",))
    _, attempt_id = _study_with(ctx, folder, egress="open")
    # Placed by the scheduler's reconcile, routed through the gateway, whose proxy has gone
    # since (the process that placed it ended): it answers again before the family's start.
    with ctx.session() as session:
        for host in session.scalars(select(Host)):
            host.enabled = False
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.PENDING
    with ctx.session() as session:
        for host in session.scalars(select(Host)):
            host.enabled = True
        report = workspaces.reconcile(session, factory, router=egress_gateway.router(ctx))
        assert len(report.placed) == 1, report
    gateway.stop()
    started = launch.start_placed_attempts(ctx, factory)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        assert started == [attempt_id], attempt.end_reason
    assert server.seen == ["/dataset/train.csv"]
    assert _exec(ctx, attempt_id, "cat /home/submission/fetched.txt") == b"ok"

    folder = _fetching_family(tmp_path, "fetchoff", url, ())
    _, attempt_id = _study_with(ctx, folder, egress="none", name="offline")
    status = launch.launch(ctx, attempt_id, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.FAILED
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.end_reason is not None
        assert "fetchoff.start(main) failed" in attempt.end_reason
        assert "URLError" in attempt.end_reason
    assert server.seen == ["/dataset/train.csv"]
