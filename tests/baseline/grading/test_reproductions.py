"""Reproduction rows in the queue: whatever breaks, a row ends, with its error, and the queue
moves on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import docker
import pytest
from docker.errors import NotFound
from sqlalchemy import select

from baseline.context import Context
from baseline.grading import reproductions, retries
from baseline.jobs import orchestration
from baseline.models import (
    Host,
    JobStatus,
    Reproduction,
    Snapshot,
    SnapshotKind,
    Workspace,
    WorkspaceStatus,
    utcnow,
)
from baseline.workspaces import workspaces
from infra.docker_backend import DockerBackend
from infra.workspace import WorkspaceBackend
from tests.docker_env import LOCAL_URL, TEST_LABELS, docker_url, test_image
from tests.scoring.scoring_world import build_world, snapshot_reference

__all__ = ["test_image"]


@contextmanager
def _no_workspace(ctx: Context, **_kwargs: object) -> Iterator[reproductions.Placed]:
    """Stands for a placed workspace; what matters is what happens inside it."""
    handle = SimpleNamespace(name="ws-stand-in")
    yield reproductions.Placed(0, object(), handle)  # type: ignore[arg-type]


def test_a_crash_inside_a_reproduction_is_retried_then_failed_and_the_queue_moves_on(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = build_world(ctx, image_digest="sha256:" + "a" * 64)
    first = snapshot_reference(ctx, world.attempt_id, tmp_path / "a", due_working_s=1.0)
    second = snapshot_reference(
        ctx, world.agent_attempt_id, tmp_path / "b", kind=SnapshotKind.FINAL, due_working_s=2.0
    )
    with ctx.session() as session:
        for snapshot_id in (first, second):
            snapshot = session.get(Snapshot, snapshot_id)
            assert snapshot is not None
            reproductions.queue_reproduction(session, snapshot)
    calls: list[str] = []

    def explode(*_args: object, **_kwargs: object) -> None:
        calls.append("run")
        raise MemoryError("the workspace wrote more than the orchestrator could hold")

    monkeypatch.setattr(reproductions, "disposable_workspace", _no_workspace)
    monkeypatch.setattr(reproductions, "reproduce_in_workspace", explode)
    monkeypatch.setattr(orchestration, "discover", lambda *_a, **_k: None)
    report = orchestration.process_queue(ctx)
    assert calls == ["run", "run"]  # the second one ran although the first one crashed
    # Baseline's own failure says nothing about the submission: tried again after a back-off,
    # failed only after the last try.
    for _ in range(retries.MAX_TRIES - 1):
        with ctx.session() as session:
            for row in session.scalars(select(Reproduction)):
                assert row.status is JobStatus.QUEUED and row.retry_at is not None
                assert "MemoryError: the workspace" in (row.error or "")
                row.retry_at = utcnow() - timedelta(seconds=1)
        report = orchestration.process_queue(ctx)
    assert len(calls) == 2 * retries.MAX_TRIES
    with ctx.session() as session:
        rows = session.scalars(select(Reproduction).order_by(Reproduction.id)).all()
        assert [r.status for r in rows] == [JobStatus.FAILED, JobStatus.FAILED]
        for row in rows:
            assert row.error is not None
            assert row.error.startswith("failed 3 times; last error: MemoryError: the workspace")
            assert row.finished_at is not None
    assert set(report.reproductions.values()) == {"failed"}


def test_the_live_log_stays_bounded_on_the_portals_disk_and_keeps_head_and_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reproduce.sh printing 64 MiB leaves at most head + tail + one line in the live file."""
    monkeypatch.setattr(reproductions, "LIVE_LOG_HEAD", 4096)
    monkeypatch.setattr(reproductions, "LIVE_LOG_TAIL", 8192)
    path = tmp_path / "live" / "1.log"
    live = reproductions._LiveLog(path)
    biggest = 0
    chunk = 65536
    for index in range(1024):
        live.write(bytes([65 + index % 26]) * chunk)
        biggest = max(biggest, path.stat().st_size)
    live.write(b"the last line\n")
    live._write_tail()  # what the next rewrite (at most a second later) writes
    data = path.read_bytes()
    assert biggest <= 4096 + 8192 + 64
    assert data[:4096] == b"A" * 4096
    assert b"bytes left out ..." in data[4096:4200]
    omitted = 1024 * chunk + len(b"the last line\n") - 4096 - 8192
    assert f"[... {omitted} bytes left out ...]".encode() in data
    assert data.endswith(b"J" * (8192 - 14) + b"the last line\n")
    live.close()
    assert not path.exists()


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)


# The process that runs the reproduction and is killed: the scheduler's, or `baseline reproduce`.
_RUNNER = """
import sys
from pathlib import Path
from baseline.config import Settings
from baseline.context import Context
from baseline.grading import reproductions
from infra.docker_backend import DockerBackend
from tests.docker_env import TEST_LABELS
home, database_url, reproduction_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = Context.from_settings(Settings(Path(home), database_url, secret_key="test-secret"))
reproductions.run_reproduction(
    ctx, reproduction_id,
    backend_factory=lambda host: DockerBackend.from_url(host.docker_url, labels=TEST_LABELS),
)
"""


@pytest.mark.docker
def test_a_reproduction_whose_process_was_killed_is_recovered_with_nothing_left_on_the_engine(
    ctx: Context, tmp_path: Path, test_image: str
) -> None:
    """SIGKILL during reproduce.sh: the row stayed `running` for ever and its container, disk
    and volume stayed on the engine. Once its heartbeat is stale (not before), recovery removes
    the workspace and the live log and queues it again as a failed try of Baseline's own."""
    docker_url("unix")
    world = build_world(ctx, image_digest=test_image)
    with ctx.session() as session:
        host = workspaces.add_host(session, "local", LOCAL_URL, None)
        assert workspaces.check_host(session, host).healthy, host.last_error
    sleeping = {"reproduce.sh": "#!/bin/bash\necho started\nsleep 600\n"}
    snapshot_id = snapshot_reference(ctx, world.attempt_id, tmp_path / "ref", edit=sleeping)
    with ctx.session() as session:
        snapshot = session.get(Snapshot, snapshot_id)
        assert snapshot is not None
        reproduction_id = reproductions.queue_reproduction(session, snapshot).id
    output = tmp_path / "runner.log"
    runner = subprocess.Popen(
        [sys.executable, "-c", _RUNNER, str(ctx.settings.home), ctx.settings.database_url,
         str(reproduction_id)],
        cwd=Path(__file__).resolve().parents[3], stdout=output.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        name = None
        live_log = reproductions.live_log_path(ctx.settings, reproduction_id)
        while time.monotonic() < deadline and runner.poll() is None:
            with ctx.session() as session:
                row = session.get(Reproduction, reproduction_id)
                assert row is not None
                name = row.details.get("workspace")
            if name and live_log.exists() and b"started" in live_log.read_bytes():
                break
            time.sleep(0.5)
        assert name, f"the run never reached reproduce.sh:\n{output.read_text()[-3000:]}"
        os.kill(runner.pid, signal.SIGKILL)
    finally:
        runner.kill()
        runner.wait()
    engine = docker.DockerClient(base_url=LOCAL_URL)
    try:
        assert engine.containers.get(name).status == "running"  # left behind by the kill
        with ctx.session() as session:
            row = session.get(Reproduction, reproduction_id)
            assert row is not None and row.status is JobStatus.RUNNING
            assert row.heartbeat_at is not None

        assert reproductions.recover_interrupted(ctx, backend_factory=factory) == []  # fresh
        later = utcnow() + timedelta(seconds=reproductions.STALE_AFTER_S + 1)
        recovered = reproductions.recover_interrupted(ctx, backend_factory=factory, now=later)
        assert recovered == [reproduction_id]

        with ctx.session() as session:
            row = session.get(Reproduction, reproduction_id)
            assert row is not None
            assert row.status is JobStatus.QUEUED and row.tries == 1 and row.retry_at
            assert row.started_at is None and row.details["interrupted"] is True
            assert "interrupted: its process stopped" in (row.error or "")
            workspace = session.scalar(select(Workspace).where(Workspace.name == name))
            assert workspace is not None and workspace.status is WorkspaceStatus.DESTROYED
        with pytest.raises(NotFound):
            engine.containers.get(name)
        with pytest.raises(NotFound):
            engine.volumes.get(f"{name}-submission")
        assert not live_log.exists()
        assert reproductions.recover_interrupted(ctx, backend_factory=factory, now=later) == []
    finally:
        engine.close()
