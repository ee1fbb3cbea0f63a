"""The GPUs a Task Standard family's scoring container gets, as Vivaria scores a family in the
task's own environment, GPUs included (RE-Bench's score.py runs the solution on the GPU).

An intermediate score gets the live workspace's GPUs. The final score comes after the attempt's
workspace gave its GPUs back: the profile's GPUs on the attempt's host are taken from the pool
for the scoring alone and given back when it ends, however it ends; when too few are free the
grading waits in the queue, saying so, never failed nor scored at the floor.

No GPU exists here: the scoring container's creation is recorded on a fake engine, and the rows
(the host's GPU inventory, the assignments) are written by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import docker
import pytest
from docker.errors import APIError
from sqlalchemy import select

from baseline.context import Context
from baseline.grading import claims, script_scoring
from baseline.models import (
    AttemptStatus,
    EgressPolicy,
    GpuAssignment,
    Host,
    JobStatus,
    Snapshot,
    SnapshotKind,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.workspaces import workspaces
from baseline.workspaces.workspaces import BackendFactory
from infra.blobs import BlobStore
from infra.docker_backend import DockerBackend
from infra.snapshots.manifest import Manifest
from infra.workspace import WorkspaceBackend, WorkspaceError, WorkspaceHandle, WorkspaceState
from tests.baseline.tasks.family_world import family_attempt, hold_gpus
from tests.db_writes import recording_writes

PROFILE = "a10"  # one NVIDIA A10 (`infra.hardware.BUILTIN`)
A10 = "NVIDIA A10"
STANDARD = {
    "family": "gpufam",
    "task": "main",
    "hooks": ["score", "intermediate_score"],
    "resources": {"gpu": {"count_range": [1, 1], "model": "a10"}},
}


class ScoringContainer:
    """The scoring container: the hook prints the score 1.0; `on_start` sees the moment it runs."""

    def __init__(self, on_start: Any = None) -> None:
        self.on_start = on_start

    def put_archive(self, path: str, data: bytes) -> bool:
        return True

    def start(self) -> None:
        if self.on_start is not None:
            self.on_start()

    def wait(self, timeout: float) -> dict[str, int]:
        return {"StatusCode": 0}

    def logs(self, stdout: bool, stderr: bool) -> bytes:
        return b"1.0\n" if stdout else b""

    def remove(self, force: bool) -> None:
        return None


class Engine:
    """The engine as the scoring sees it: the attempt's saved state is there; containers made
    are recorded with their create options (or their creation fails, `fail`)."""

    def __init__(self, on_start: Any = None, fail: bool = False) -> None:
        self.created: list[dict[str, Any]] = []
        self.container = ScoringContainer(on_start)
        self.fail = fail
        self.client = MagicMock(spec=docker.DockerClient)
        self.client.api = None
        self.client.containers.create.side_effect = self._create

    def _create(self, image: str, command: list[str], **options: Any) -> ScoringContainer:
        if self.fail:
            raise APIError("the engine broke")
        self.created.append(options)
        return self.container


class Backend(DockerBackend):
    """The Docker backend on `Engine`; records the workspaces it destroys."""

    def __init__(self, engine: Engine, destroyed: list[str]) -> None:
        super().__init__(engine.client, local=True)
        self.destroyed = destroyed

    def destroy(self, handle: WorkspaceHandle, *, keep_submission: bool = False) -> None:
        self.destroyed.append(handle.name)

    def status(self, handle: WorkspaceHandle) -> WorkspaceState:
        """The attempts' workspaces run; a scoring's has no workspace container of its own."""
        scoring = handle.name.startswith(f"ws-{WorkspacePurpose.SCORING.value}-")
        return WorkspaceState.MISSING if scoring else WorkspaceState.RUNNING

    def close(self) -> None:
        return None


def _factory(engine: Engine, destroyed: list[str]) -> BackendFactory:
    def backend_factory(_host: Host) -> WorkspaceBackend:
        return Backend(engine, destroyed)

    return backend_factory


def _family_attempt(
    ctx: Context, *, live: bool, held: tuple[int, ...] = (), taken: tuple[int, ...] = ()
) -> tuple[int, int]:
    """(attempt id, host id) of a family attempt on a host with GPUs 0-3 (A10s): live (its
    workspace running, holding `held`) or ended (its workspace stopped, holding none); `taken`
    are held by another attempt's workspace."""
    with ctx.session() as session:
        host = Host(
            name="gpu-host",
            docker_url="unix:///var/run/docker.sock",
            healthy=True,
            gpus=[{"index": index, "model": A10} for index in range(4)],
            gpus_declared=True,
        )
        attempt = family_attempt(
            session,
            host,
            family="gpufam",
            scoring={
                "script": "family/hook.py",
                "command": "python3 {script} score",
                "intermediate_command": "python3 {script} intermediate_score",
                "starting_score": 0.0,
                "reference_score": 1.0,
                "user": "root",
                "task_standard": STANDARD,
            },
            profile=PROFILE,
            egress=EgressPolicy.NONE,
            status=AttemptStatus.RUNNING if live else AttemptStatus.SUBMITTED,
            image_digest="sha256:" + "f" * 64,
        )
        workspace = Workspace(
            attempt_id=attempt.id,
            purpose=WorkspacePurpose.ATTEMPT,
            host_id=host.id,
            backend="docker",
            name=f"ws-a{attempt.id}-gpu",
            container_id="c" * 64,
            submission_volume=f"ws-a{attempt.id}-gpu-submission",
            image="baseline-family:gpufam",
            image_digest="sha256:" + "f" * 64,
            hardware_profile=PROFILE,
            status=WorkspaceStatus.RUNNING if live else WorkspaceStatus.STOPPED,
        )
        other = Workspace(
            purpose=WorkspacePurpose.ATTEMPT,
            host_id=host.id,
            backend="docker",
            name="ws-other",
            image="baseline-family:other",
            hardware_profile="h100x4",
            status=WorkspaceStatus.RUNNING,
        )
        session.add_all([workspace, other])
        session.flush()
        hold_gpus(session, workspace, held)
        hold_gpus(session, other, taken)
        return attempt.id, host.id


def _final_grading(ctx: Context, attempt_id: int) -> int:
    store = BlobStore(ctx.settings.blob_dir)
    digest = store.put_bytes(Manifest(version=1).model_dump_json().encode())
    with ctx.session() as session:
        snapshot = Snapshot(
            attempt_id=attempt_id,
            kind=SnapshotKind.FINAL,
            due_working_s=60.0,
            taken_working_s=60.0,
            manifest_sha256=digest,
        )
        session.add(snapshot)
        session.flush()
        return script_scoring.create_script_grading(session, snapshot).id


def _live_gpus(ctx: Context, host_id: int) -> dict[int, str]:
    """The host's GPUs held now: device index -> the holding workspace's purpose."""
    with ctx.session() as session:
        rows = session.execute(
            select(GpuAssignment.device_index, Workspace.purpose)
            .join(Workspace, Workspace.id == GpuAssignment.workspace_id)
            .where(GpuAssignment.host_id == host_id, GpuAssignment.released_at.is_(None))
        )
        return {index: purpose.value for index, purpose in rows}


def _scoring_workspaces(ctx: Context) -> list[tuple[str, WorkspaceStatus]]:
    with ctx.session() as session:
        rows = session.scalars(
            select(Workspace).where(Workspace.purpose == WorkspacePurpose.SCORING)
        )
        return [(row.name, row.status) for row in rows]


def _device_ids(options: dict[str, Any]) -> list[str]:
    (request,) = options.get("device_requests") or [{}]
    assert request.get("Driver") == "nvidia" and request.get("Capabilities") == [["gpu"]]
    return list(request["DeviceIDs"])


@pytest.mark.sqlite_only("the scoring container's create options")
def test_an_intermediate_score_runs_with_the_workspaces_gpus(ctx: Context, tmp_path: Path) -> None:
    attempt_id, host_id = _family_attempt(ctx, live=True, held=(3, 1))
    engine = Engine()
    destroyed: list[str] = []
    entry = script_scoring.intermediate_score(
        ctx,
        attempt_id,
        None,
        backend_factory=_factory(engine, destroyed),
        resolver=lambda session, attempt: MagicMock(),
        store=BlobStore(tmp_path),
    )
    assert entry.error is None and entry.raw_score == 1.0
    (options,) = engine.created
    assert _device_ids(options) == ["1", "3"]  # the live workspace's own
    # Nothing else taken from the pool for it: the workspace still holds its own, alone.
    assert _live_gpus(ctx, host_id) == {1: "attempt", 3: "attempt"}
    assert _scoring_workspaces(ctx) == []


@pytest.mark.sqlite_only("the scoring container's create options")
def test_the_final_score_holds_the_profiles_gpus_while_it_runs_and_gives_them_back(
    ctx: Context,
) -> None:
    attempt_id, host_id = _family_attempt(ctx, live=False, taken=(0,))
    grading_id = _final_grading(ctx, attempt_id)
    held_while_running: list[dict[int, str]] = []
    reconciled: list[workspaces.ReconcileReport] = []
    destroyed: list[str] = []

    def while_running() -> None:
        # A reconcile meanwhile leaves the scoring's workspace to its job: not dead, not
        # restarted, its GPUs held.
        with ctx.session() as session:
            reconciled.append(workspaces.reconcile(session, _factory(engine, destroyed)))
        held_while_running.append(_live_gpus(ctx, host_id))

    engine = Engine(on_start=while_running)
    grading = script_scoring.run_script_grading(
        ctx, grading_id, backend_factory=_factory(engine, destroyed)
    )
    assert grading.status is JobStatus.SUCCEEDED, grading.error
    assert grading.raw_score == 1.0 and grading.floor_reason is None
    (options,) = engine.created
    assert _device_ids(options) == ["1"]  # the profile's one A10, a free one on the host
    assert held_while_running == [{0: "attempt", 1: "scoring"}]
    (report,) = reconciled
    assert (report.died, report.restarted, report.errors) == ([], [], {})
    ((name, status),) = _scoring_workspaces(ctx)
    # The container carries the scoring workspace's name, which the grading keeps (recovery
    # destroys it, container and all, should this process die); given back once it ended.
    assert options["name"] == name and grading.config["workspace"] == name
    assert status is WorkspaceStatus.DESTROYED and destroyed == [name]
    assert _live_gpus(ctx, host_id) == {0: "attempt"}


@pytest.mark.sqlite_only("the scoring container's create options")
def test_a_final_score_that_cannot_run_gives_its_gpus_back(ctx: Context) -> None:
    attempt_id, host_id = _family_attempt(ctx, live=False)
    grading_id = _final_grading(ctx, attempt_id)
    destroyed: list[str] = []
    grading = script_scoring.run_script_grading(
        ctx, grading_id, backend_factory=_factory(Engine(fail=True), destroyed)
    )
    # Baseline's failure (the engine), retried: not the participant's, never at the floor.
    assert grading.status is JobStatus.QUEUED and grading.tries == 1
    assert grading.error is not None and "the engine broke" in grading.error
    assert grading.score is None and grading.floor_reason is None
    ((name, status),) = _scoring_workspaces(ctx)
    assert status is WorkspaceStatus.DESTROYED and destroyed == [name]
    assert _live_gpus(ctx, host_id) == {}


@pytest.mark.sqlite_only("the grading's queue state")
def test_a_final_score_with_no_free_gpu_waits_in_the_queue_saying_so(ctx: Context) -> None:
    attempt_id, host_id = _family_attempt(ctx, live=False, taken=(0, 1, 2, 3))
    grading_id = _final_grading(ctx, attempt_id)
    engine = Engine()
    grading = script_scoring.run_script_grading(
        ctx, grading_id, backend_factory=_factory(engine, [])
    )
    assert grading.status is JobStatus.QUEUED
    assert not grading.tries  # no try counted: it waits for room, as a scoring with no host
    assert grading.error is not None
    assert "1 GPU(s) of profile a10 on host gpu-host" in grading.error
    assert "too few are free now" in grading.error
    assert grading.score is None and grading.floor_reason is None and grading.started_at is None
    assert engine.created == []  # never run without its GPUs
    assert _scoring_workspaces(ctx) == []  # nothing left holding anything
    assert _live_gpus(ctx, host_id) == dict.fromkeys(range(4), "attempt")


def _no_engine(_host: Host) -> WorkspaceBackend:
    raise AssertionError("no engine is needed to find that there is still no room")


@pytest.mark.sqlite_only("statements recorded; the allocator's queries run on both elsewhere")
def test_a_final_score_still_waiting_for_gpus_asks_again_read_only_and_runs_once_one_is_free(
    ctx: Context,
) -> None:
    """Each try of a final score waiting for its host's GPUs, one a pass for as long as they
    stayed taken, claimed the grading, started its heartbeat, made a scoring workspace's row,
    found no room and queued the grading again. One that says it waits now asks first, read
    only; once a GPU is free it runs with that one."""
    attempt_id, host_id = _family_attempt(ctx, live=False, taken=(0, 1, 2, 3))
    grading_id = _final_grading(ctx, attempt_id)
    engine = Engine()
    waiting = script_scoring.run_script_grading(
        ctx, grading_id, backend_factory=_factory(engine, [])
    )
    assert waiting.error is not None and "too few are free now" in waiting.error
    with recording_writes(ctx.engine) as written:
        again = script_scoring.run_script_grading(ctx, grading_id, backend_factory=_no_engine)
    assert written == []
    assert again.status is JobStatus.QUEUED and again.error == waiting.error
    assert not again.tries and again.started_at is None
    with ctx.session() as session:
        freed = session.scalars(
            select(GpuAssignment).where(
                GpuAssignment.host_id == host_id, GpuAssignment.device_index == 2
            )
        ).one()
        freed.released_at = freed.assigned_at
    destroyed: list[str] = []
    scored = script_scoring.run_script_grading(
        ctx, grading_id, backend_factory=_factory(engine, destroyed)
    )
    assert scored.status is JobStatus.SUCCEEDED, scored.error
    (options,) = engine.created
    assert _device_ids(options) == ["2"]


@pytest.mark.sqlite_only("the grading's queue state")
def test_a_final_score_waiting_on_a_host_that_lost_its_gpus_fails_its_try_saying_why(
    ctx: Context,
) -> None:
    """The read-only question holds a grading back only while the host has the GPUs and they
    are taken: a host whose inventory no longer has them lets the next try say so, counted."""
    attempt_id, host_id = _family_attempt(ctx, live=False, taken=(0, 1, 2, 3))
    grading_id = _final_grading(ctx, attempt_id)
    script_scoring.run_script_grading(ctx, grading_id, backend_factory=_factory(Engine(), []))
    with ctx.session() as session:
        host = session.get(Host, host_id)
        assert host is not None
        host.gpus = [{"index": 0, "model": "NVIDIA T4"}]
    grading = script_scoring.run_script_grading(ctx, grading_id, backend_factory=_no_engine)
    assert grading.status is JobStatus.QUEUED and grading.tries == 1
    assert grading.error is not None
    assert "the final score needs 1 GPU(s) of profile a10: host gpu-host" in grading.error


class UnansweringBackend(Backend):
    """A host whose engine does not answer when the scoring's workspace is destroyed."""

    def destroy(self, handle: WorkspaceHandle, *, keep_submission: bool = False) -> None:
        raise WorkspaceError("the engine does not answer")


@pytest.mark.sqlite_only("the grading's and the workspace's rows")
def test_a_final_score_whose_gpus_cannot_be_given_back_keeps_its_error_for_the_sweep(
    ctx: Context,
) -> None:
    """The scoring broke, and destroying its workspace then failed too (the host's engine did
    not answer): the destroy's PlacementError, raised in a `finally`, replaced the scoring's
    own error. Now the grading says what broke, and the workspace, still holding its GPUs, is
    named on the grading and destroyed by the next sweep, its GPUs given back."""
    attempt_id, host_id = _family_attempt(ctx, live=False)
    grading_id = _final_grading(ctx, attempt_id)
    engine = Engine(fail=True)
    grading = script_scoring.run_script_grading(
        ctx, grading_id, backend_factory=lambda _host: UnansweringBackend(engine, [])
    )
    assert grading.status is JobStatus.QUEUED and grading.tries == 1
    assert grading.error is not None and "the engine broke" in grading.error
    ((name, status),) = _scoring_workspaces(ctx)
    assert status is WorkspaceStatus.RUNNING and grading.config["workspace"] == name
    assert _live_gpus(ctx, host_id) == {0: "scoring"}  # held still
    destroyed: list[str] = []
    with ctx.session() as session:
        assert claims.sweep_disposable(session, _factory(engine, destroyed)) == [name]
    assert destroyed == [name]
    assert _live_gpus(ctx, host_id) == {}
