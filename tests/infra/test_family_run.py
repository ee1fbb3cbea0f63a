"""A family's scoring run, left on the engine by a process that died while it scored, is removed
by its name alone: its container, still running, and then the state image it was made of (an
image a container still uses is only untagged by a forced removal, its layers kept). A final
score with GPUs is named after its SCORING workspace, whose destroy removes both."""

from __future__ import annotations

import contextlib
import time

import docker
import pytest
from docker.errors import ImageNotFound, NotFound

from infra.docker_backend import DockerBackend
from infra.family_run import (
    RUN_LABEL,
    commit_state,
    remove_scoring_run,
    scoring_run_name,
    scoring_runs,
    scoring_state_tag,
)
from infra.isolation_probe import WORKSPACE_IMAGE_LABEL, probe_image
from infra.workspace import WorkspaceHandle
from tests.docker_env import TEST_LABELS, docker_url, new_name, test_image

__all__ = ["test_image"]  # the fixture used below


def _remove_leftovers(client: docker.DockerClient, containers: list[str], tag: str) -> None:
    """What a failed test would leave: its containers and the state image."""
    for leftover in containers:
        with contextlib.suppress(NotFound):
            client.containers.get(leftover).remove(force=True)
    with contextlib.suppress(ImageNotFound):
        client.images.remove(tag, force=True)


@pytest.mark.docker
def test_a_running_scoring_run_and_its_state_are_removed_by_its_name(test_image: str) -> None:
    client = docker.DockerClient(base_url=docker_url("unix"))
    workspace = client.containers.create(
        test_image, ["sleep", "300"], name=new_name(), labels=TEST_LABELS
    )
    name = scoring_run_name()
    tag = scoring_state_tag(name)
    try:
        commit_state(client, workspace.id, tag)
        run = client.containers.create(tag, ["sleep", "300"], name=name, labels=TEST_LABELS)
        run.start()
        remove_scoring_run(client, name)
        with pytest.raises(NotFound):
            client.containers.get(name)
        with pytest.raises(ImageNotFound):
            client.images.get(tag)
        remove_scoring_run(client, name)  # gone already: nothing to do
    finally:
        _remove_leftovers(client, [name, workspace.id], tag)
        client.close()


@pytest.mark.docker
def test_the_engine_lists_its_scoring_runs_by_container_and_by_state_image(
    test_image: str,
) -> None:
    """`scoring_runs` finds a run of its scope (a deployment's labels) by its container
    (labelled RUN_LABEL, named after it) and one whose container is gone by its state image
    alone, each with when it was made; not other containers, not another scope's runs on the
    same engine (another portal's), and not a run once it is removed."""
    client = docker.DockerClient(base_url=docker_url("unix"))
    workspace = client.containers.create(
        test_image, ["sleep", "300"], name=new_name(), labels=TEST_LABELS
    )
    ours, others = {**TEST_LABELS, "scope": new_name()}, {**TEST_LABELS, "scope": new_name()}
    running, state_only, elsewhere = scoring_run_name(), scoring_run_name(), scoring_run_name()
    try:
        before = time.time()
        commit_state(client, workspace.id, scoring_state_tag(running), ours)
        commit_state(client, workspace.id, scoring_state_tag(state_only), ours)
        commit_state(client, workspace.id, scoring_state_tag(elsewhere), others)
        for name, labels in ((running, ours), (elsewhere, others)):
            client.containers.create(
                scoring_state_tag(name),
                ["sleep", "300"],
                name=name,
                labels={**labels, RUN_LABEL: "1"},
            ).start()
        scope = {"scope": ours["scope"]}
        runs = scoring_runs(client, scope)
        assert set(runs) == {running, state_only}
        for made in runs.values():
            assert before - 2 <= made <= time.time() + 2
        assert set(scoring_runs(client, {"scope": others["scope"]})) == {elsewhere}
        remove_scoring_run(client, running)
        assert set(scoring_runs(client, scope)) == {state_only}
    finally:
        for name in (running, state_only, elsewhere):
            _remove_leftovers(client, [name], scoring_state_tag(name))
        _remove_leftovers(client, [workspace.id], "none:none")
        client.close()


@pytest.mark.docker
def test_a_scoring_workspaces_destroy_removes_the_state_saved_for_it(test_image: str) -> None:
    """The scoring's process died while its container ran in a state saved for it: destroying
    its SCORING workspace (recovery's, or the sweep's) removes the container and that state
    (it stayed on the engine for good)."""
    backend = DockerBackend.from_url(docker_url("unix"), labels=TEST_LABELS)
    client = backend.client
    workspace = client.containers.create(
        test_image, ["sleep", "300"], name=new_name(), labels=TEST_LABELS
    )
    name = new_name("ws-scoring")
    tag = scoring_state_tag(name)
    try:
        commit_state(client, workspace.id, tag)
        client.containers.create(tag, ["sleep", "300"], name=name, labels=TEST_LABELS).start()
        handle = WorkspaceHandle(
            name=name,
            backend=DockerBackend.name,
            container_id="",
            image_digest=None,
            submission_volume=f"{name}-submission",  # as a SCORING row's handle names it
        )
        backend.destroy(handle)
        with pytest.raises(NotFound):
            client.containers.get(name)
        with pytest.raises(ImageNotFound):
            client.images.get(tag)
        backend.destroy(handle)  # gone already: nothing to do
    finally:
        _remove_leftovers(client, [name, workspace.id], tag)
        backend.close()


@pytest.mark.docker
def test_a_saved_state_is_never_taken_for_a_workspace_image(test_image: str) -> None:
    """A commit inherits its image's labels: a state saved from a workspace said
    "baseline.image=workspace", and a host check chose it (the newest such image) to probe
    network isolation with. Removed by its scoring meanwhile, the probe's container could not
    be made (the engine went to pull it from a registry) and the healthy host was marked
    unhealthy (seen in CI). A state says what it is."""
    client = docker.DockerClient(base_url=docker_url("unix"))
    workspace = client.containers.create(
        test_image, ["sleep", "300"], name=new_name(), labels=TEST_LABELS
    )
    tag = scoring_state_tag(scoring_run_name())
    try:
        state = commit_state(client, workspace.id, tag)
        labels = client.images.get(state).labels
        assert labels["baseline.image"] == "scoring-state" and labels[RUN_LABEL] == "state"
        workspace_images = client.images.list(filters={"label": WORKSPACE_IMAGE_LABEL})
        assert state not in {image.id for image in workspace_images}
        assert probe_image(client) != state
    finally:
        _remove_leftovers(client, [workspace.id], tag)
        client.close()
