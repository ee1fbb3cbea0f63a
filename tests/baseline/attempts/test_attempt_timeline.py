"""A time-scaled attempt on a real workspace, driven by the real scheduler (APScheduler).

The study runs at 1,200 working seconds per wall second (one working hour = 3 wall seconds). Files
are written inside the workspace between checkpoints and during a pause; each checkpoint must be
taken at its working time and hold exactly the files written before it.

Tolerance: a checkpoint is taken at most 0.5 wall seconds after it falls due, i.e. within 600
working seconds (10 working minutes) at this scale; at scale 1 that is half a second.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from baseline.attempts import attempts, snapshots
from baseline.context import Context
from baseline.jobs.scheduler import SnapshotScheduler
from baseline.models import Attempt, PauseReason, SnapshotKind
from infra.workspace import HardwareProfile, WorkspaceBackend, WorkspaceHandle, WorkspaceSpec
from tests.baseline.attempt_world import make_attempt

SCALE = 1200.0
H = 3600.0
TOLERANCE_WALL_S = 0.5
PROFILE = HardwareProfile(name="cpu-small", cpus=0.5, memory_mb=256, pids=64)


@pytest.fixture
def local_workspace(tmp_path: Path) -> Iterator[tuple[WorkspaceBackend, WorkspaceHandle]]:
    from tests.infra.test_local_backend import sandbox_backend

    for backend in sandbox_backend(tmp_path / "local"):
        spec = WorkspaceSpec(name=f"ws-{uuid.uuid4().hex[:8]}", image="host", profile=PROFILE)
        handle = backend.create(spec)
        backend.start(handle)
        yield backend, handle
        backend.destroy(handle)


@pytest.fixture
def docker_workspace() -> Iterator[tuple[WorkspaceBackend, WorkspaceHandle]]:
    from infra.docker_backend import DockerBackend
    from tests.docker_env import TEST_LABELS, docker_url, new_name, workspace_image

    backend = DockerBackend.from_url(docker_url("unix"), labels=TEST_LABELS)
    spec = WorkspaceSpec(name=new_name(), image=workspace_image(), profile=PROFILE)
    handle = backend.create(spec)
    try:
        backend.start(handle)
        yield backend, handle
    finally:
        backend.destroy(handle)
        backend.close()


def _write(backend: WorkspaceBackend, handle: WorkspaceHandle, name: str) -> None:
    result = backend.exec(
        handle, ["sh", "-c", f"echo {name} > /home/submission/{name}"], timeout_s=30
    )
    assert result.exit_code == 0, result.output


def _run_timeline(ctx: Context, backend: WorkspaceBackend, handle: WorkspaceHandle) -> None:
    _write(backend, handle, "f0")
    attempt_id = make_attempt(ctx, checkpoints=[0.5, 1.0, 1.5], limit_hours=2.0, time_scale=SCALE)

    def resolve(_session: Session, _attempt: Attempt) -> snapshots.SubmissionSource:
        return snapshots.BackendSource(backend, handle)

    runner = SnapshotScheduler(ctx, resolve, sweep_every_s=1.0)
    runner.start()
    try:
        attempts.start(ctx, attempt_id, None, resolve)
        with ctx.session() as session:
            attempt = session.get(Attempt, attempt_id)
            assert attempt is not None and attempt.started_at is not None
            t0 = attempt.started_at

        def sleep_until_wall(seconds: float) -> None:
            target = t0 + timedelta(seconds=seconds)
            delay = (target - _now()).total_seconds()
            if delay > 0:
                time.sleep(delay)

        # working 0.25h (0.75 s wall): f1 lands before the 0.5h checkpoint (1.5 s)
        sleep_until_wall(0.75)
        _write(backend, handle, "f1")
        sleep_until_wall(2.25)  # working 0.75h
        _write(backend, handle, "f2")
        sleep_until_wall(3.6)  # working 1.2h: pause for 1.5 wall s
        attempts.pause(ctx, attempt_id, PauseReason.PARTICIPANT, None, "break")
        _write(backend, handle, "f3")  # written while paused: belongs to the 1.5h checkpoint
        sleep_until_wall(5.1)
        attempts.resume(ctx, attempt_id, None)
        # 1.5h checkpoint now at ~3.6 + 1.5 + 0.9 = 6.0 s wall; limit 2h at ~7.5 s
        sleep_until_wall(6.6)
        _write(backend, handle, "f4")  # after 1.5h, before the limit
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with ctx.session() as session:
                attempt = session.get(Attempt, attempt_id)
                assert attempt is not None
                if attempt.ended_at is not None:
                    break
            time.sleep(0.1)
    finally:
        runner.shutdown()

    store = snapshots.store_for(ctx)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.status.value == "ended"
        taken = {
            (s.kind, s.due_working_s): (s, snapshots.manifest_of(store, s))
            for s in attempt.snapshots
        }
    expected = {
        (SnapshotKind.START, 0.0): {"f0"},
        (SnapshotKind.CHECKPOINT, 0.5 * H): {"f0", "f1"},
        (SnapshotKind.CHECKPOINT, 1.0 * H): {"f0", "f1", "f2"},
        (SnapshotKind.CHECKPOINT, 1.5 * H): {"f0", "f1", "f2", "f3"},
        (SnapshotKind.FINAL, 2.0 * H): {"f0", "f1", "f2", "f3", "f4"},
    }
    assert set(taken) == set(expected)
    for key, files in expected.items():
        snapshot, manifest = taken[key]
        present = {e.path for e in manifest.files if not e.path.startswith(".git/")}
        assert present == files, key
        lateness_wall = (snapshot.taken_working_s - snapshot.due_working_s) / SCALE
        assert -1e-6 <= lateness_wall <= TOLERANCE_WALL_S, (key, lateness_wall)
        assert not snapshot.late


def _now() -> datetime:
    from baseline.models import utcnow

    return utcnow()


def test_timeline_on_the_local_sandbox(
    ctx: Context, local_workspace: tuple[WorkspaceBackend, WorkspaceHandle]
) -> None:
    _run_timeline(ctx, *local_workspace)


@pytest.mark.docker
def test_timeline_on_docker(
    ctx: Context, docker_workspace: tuple[WorkspaceBackend, WorkspaceHandle]
) -> None:
    _run_timeline(ctx, *docker_workspace)
