"""What a demo makes on the Docker Engine is its own deployment's, and goes when it ends
(issue 31, item 9): its reaper removes the deployment's containers, volumes and disk images
once the demo process is gone, however it ended, and nothing of another deployment."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from baseline.demo.engine_cleanup import own_deployment
from baseline.workspaces.backends import DEPLOYMENT_LABEL
from infra.disk_images import DiskImages
from infra.docker_backend import DockerBackend
from infra.gpus import local_runner
from infra.hardware import get_profile
from infra.workspace import WorkspaceHandle, WorkspaceSpec, WorkspaceState
from tests.conftest import REPO
from tests.docker_env import (
    LOCAL_URL,
    TEST_LABELS,
    docker_url,
    new_deployment,
    new_name,
    remove_deployment,
    test_image,
)

__all__ = ["test_image"]

# Stands for `baseline demo`: starts its reaper, then dies as hard as a process can.
KILLED_DEMO = """
import os, signal, sys
from baseline.demo.engine_cleanup import start_reaper
start_reaper(sys.argv[1], sys.argv[2])
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_demo_is_a_deployment_of_its_own_named_after_its_home(tmp_path: Path) -> None:
    one, other = tmp_path / "one", tmp_path / "other"
    assert own_deployment(one, None) == own_deployment(one, None) != own_deployment(other, None)
    assert own_deployment(one, None).startswith("demo-")
    # Never the deployment its shell names (a real portal's, or `default`): one of its own,
    # under that name (a test run's stays a test deployment).
    assert own_deployment(one, "default") not in ("default", own_deployment(one, None))
    assert own_deployment(one, "test-run-1").startswith("test-run-1-demo-")


def _workspace(deployment: str, image: str) -> tuple[DockerBackend, WorkspaceHandle]:
    """A workspace of `deployment`, its submission a disk image, as a portal makes them, and
    the deployment's network (as `host check` makes its egress network)."""
    labels = {**TEST_LABELS, DEPLOYMENT_LABEL: deployment}
    backend = DockerBackend.from_url(LOCAL_URL, labels=labels, disk_quota=True)
    backend.client.networks.create(f"bl-test-{deployment}", labels=labels, internal=True)
    spec = WorkspaceSpec(name=new_name("ws-demo"), image=image, profile=get_profile("cpu")[0])
    return backend, backend.create(spec)


@pytest.fixture
def deployments() -> Iterator[tuple[str, str]]:
    docker_url("unix")
    demo, portal = new_deployment("demo-reaped"), new_deployment("portal")
    yield demo, portal
    for deployment in (demo, portal):
        remove_deployment(deployment)


@pytest.mark.docker
def test_the_reaper_removes_its_deployment_once_the_demo_is_killed_and_nothing_else(
    deployments: tuple[str, str], test_image: str
) -> None:
    demo, portal = deployments
    mine, my_workspace = _workspace(demo, test_image)
    theirs, their_workspace = _workspace(portal, test_image)
    images = DiskImages(local_runner)
    assert Path(images.folder(my_workspace.submission_volume)).is_dir()

    killed = subprocess.run(
        [sys.executable, "-c", KILLED_DEMO, LOCAL_URL, demo],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # Its output ends when the reaper's does: the clean-up is done.
    assert killed.returncode == -9
    assert (
        f"demo clean-up: removed 1 container(s), 1 volume(s) and 1 network(s) of deployment "
        f"{demo}" in killed.stdout
    ), killed.stdout + killed.stderr
    assert killed.stderr == ""

    selector = {"label": [f"{DEPLOYMENT_LABEL}={demo}"]}
    assert mine.client.containers.list(all=True, filters=selector) == []
    assert mine.client.volumes.list(filters=selector) == []
    assert mine.client.networks.list(filters=selector) == []
    assert not Path(images.folder(my_workspace.submission_volume)).exists()
    # Another deployment's workspace (a real portal's on the same engine) is untouched.
    assert theirs.status(their_workspace) is WorkspaceState.CREATED
    assert theirs.client.volumes.get(their_workspace.submission_volume) is not None
    assert Path(images.folder(their_workspace.submission_volume)).is_dir()
    assert theirs.client.networks.get(f"bl-test-{portal}") is not None
    mine.close()
    theirs.close()
