"""Reproduction rows in the queue: whatever breaks, a row ends, with its error, and the queue
moves on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker
import pytest
from docker.errors import NotFound
from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from baseline.context import Context
from baseline.errors import Conflict
from baseline.grading import claims, reproductions, retries
from baseline.jobs import orchestration
from baseline.models import (
    Attempt,
    Host,
    JobStatus,
    Reproduction,
    Snapshot,
    SnapshotKind,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.workspaces import workspaces
from infra.docker_backend import DockerBackend
from infra.workspace import WorkspaceBackend
from scoring.reproduction import ReproductionResult
from tests.baseline.fake_engine import FakeEngine
from tests.baseline.workspaces.gpu_holder import full_gpu_host
from tests.db_writes import recording_writes
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
        live_log = None
        while time.monotonic() < deadline and runner.poll() is None:
            with ctx.session() as session:
                row = session.get(Reproduction, reproduction_id)
                assert row is not None
                name = row.details.get("workspace")
                live_log = reproductions.current_live_log(ctx.settings, row)
            if name and live_log and live_log.exists() and b"started" in live_log.read_bytes():
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
        later = utcnow() + timedelta(seconds=claims.STALE_AFTER_S + 1)
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
        assert live_log is not None and not live_log.exists()
        assert reproductions.recover_interrupted(ctx, backend_factory=factory, now=later) == []
    finally:
        engine.close()


def _result(exit_code: int) -> ReproductionResult:
    return ReproductionResult(
        reproduce_sh_present=True, exit_code=exit_code, timed_out=False, duration_s=1.0,
        log_sha256="0" * 64, log_bytes_total=0, log_truncated=False, files_before=[],
        files_after=[], added=[], removed=[], changed=[], git_status="",
        executed_manifest_sha256="1" * 64,
    )  # fmt: skip


def _queued_reproduction(ctx: Context, tmp_path: Path) -> int:
    world = build_world(ctx, image_digest="sha256:" + "a" * 64)
    snapshot_id = snapshot_reference(ctx, world.attempt_id, tmp_path / "ref")
    with ctx.session() as session:
        snapshot = session.get(Snapshot, snapshot_id)
        assert snapshot is not None
        return reproductions.queue_reproduction(session, snapshot).id


def test_a_second_runner_that_read_the_reproduction_queued_does_not_run_it_again(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's worker and `baseline reproduce` both read the row queued; the second one
    runs it to its end between the first one's read and its write. Each placed a workspace and
    ran reproduce.sh, the first one's result written over the second's; now the first one
    finds it claimed and is told so."""
    reproduction_id = _queued_reproduction(ctx, tmp_path)
    runs: list[str] = []
    refused: list[str] = []
    network = reproductions.attempt_network

    def second_runner_meanwhile(session: Session, attempt: Attempt) -> str:
        if not runs and not refused:  # the first runner, between its read and its write
            runs.append("second")
            assert reproductions.run_reproduction(ctx, reproduction_id).exit_code == 0
        return network(session, attempt)

    def reproduce(*_args: object, **_kwargs: object) -> ReproductionResult:
        return _result(0)

    monkeypatch.setattr(reproductions, "attempt_network", second_runner_meanwhile)
    monkeypatch.setattr(reproductions, "disposable_workspace", _no_workspace)
    monkeypatch.setattr(reproductions, "reproduce_in_workspace", reproduce)
    try:
        reproductions.run_reproduction(ctx, reproduction_id)
        runs.append("first")
    except Conflict as exc:  # reproductions.NotQueued
        refused.append(str(exc))
    assert runs == ["second"]
    assert refused == [f"reproduction {reproduction_id} is succeeded, not queued"]
    with ctx.session() as session:
        row = session.get(Reproduction, reproduction_id)
        assert row is not None and row.status is JobStatus.SUCCEEDED and row.exit_code == 0


def test_a_runner_whose_claim_was_taken_over_writes_nothing_over_the_next_run(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner silent past `STALE_AFTER_S` but still alive: recovery queued the row again and
    another runner claimed it. While that one runs, a third runner is refused as "already
    running"; the first runner's late result (exit 1) is not written over the second's (0)."""
    reproduction_id = _queued_reproduction(ctx, tmp_path)
    outcomes: list[str] = []

    def reproduce(*_args: object, **_kwargs: object) -> ReproductionResult:
        if outcomes:  # the second runner, while it runs: a third one is refused
            with pytest.raises(Conflict, match="running") as third:
                reproductions.run_reproduction(ctx, reproduction_id)
            outcomes.append(f"third refused: {third.value}")
            return _result(0)
        later = utcnow() + timedelta(seconds=claims.STALE_AFTER_S + 1)
        assert reproductions.recover_interrupted(ctx, now=later) == [reproduction_id]
        with ctx.session() as session:
            row = session.get(Reproduction, reproduction_id)
            assert row is not None
            row.retry_at = None  # its back-off over
        outcomes.append("taken over")
        second = reproductions.run_reproduction(ctx, reproduction_id)
        assert second.status is JobStatus.SUCCEEDED and second.exit_code == 0
        return _result(1)  # the first runner's own, late

    monkeypatch.setattr(reproductions, "disposable_workspace", _no_workspace)
    monkeypatch.setattr(reproductions, "reproduce_in_workspace", reproduce)
    row = reproductions.run_reproduction(ctx, reproduction_id)
    assert row.status is JobStatus.SUCCEEDED and row.exit_code == 0 and row.tries == 1
    assert outcomes[0] == "taken over" and len(outcomes) == 2
    assert outcomes[1].startswith(f"third refused: reproduction {reproduction_id} is already ")
    assert outcomes[1].endswith("; not running it twice")


def test_a_runner_whose_claim_was_taken_over_leaves_the_next_runs_live_log_alone(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first runner, silent but alive, was taken over; the second one runs and streams its
    log. The first one then ended and removed the shared live file (the second run's, which the
    portal shows while it runs); now each claim has its own, and the portal's is the second's."""
    reproduction_id = _queued_reproduction(ctx, tmp_path)
    second_streams, first_ended = threading.Event(), threading.Event()
    seconds: list[Reproduction] = []

    def second_runner() -> None:
        seconds.append(reproductions.run_reproduction(ctx, reproduction_id))

    def reproduce(*_args: object, on_output: Callable[[bytes], None], **_kw: object) -> Any:
        if threading.current_thread() is not threading.main_thread():  # the second runner
            on_output(b"second runner\n")
            second_streams.set()
            assert first_ended.wait(30)  # runs on while the first one ends
            return _result(0)
        on_output(b"first runner\n")
        later = utcnow() + timedelta(seconds=claims.STALE_AFTER_S + 1)
        assert reproductions.recover_interrupted(ctx, now=later) == [reproduction_id]
        with ctx.session() as session:
            row = session.get(Reproduction, reproduction_id)
            assert row is not None
            row.retry_at = None  # its back-off over
        thread.start()
        assert second_streams.wait(30)
        return _result(1)  # the first runner's own, late

    def portal_view() -> bytes | None:
        """What the portal shows of the log now: the live file of the run going on."""
        with ctx.session() as session:
            row = session.get(Reproduction, reproduction_id)
            assert row is not None and row.status is JobStatus.RUNNING
            live = reproductions.current_live_log(ctx.settings, row)
        return live.read_bytes() if live is not None and live.exists() else None

    thread = threading.Thread(target=second_runner)
    monkeypatch.setattr(reproductions, "disposable_workspace", _no_workspace)
    monkeypatch.setattr(reproductions, "reproduce_in_workspace", reproduce)
    try:
        first = reproductions.run_reproduction(ctx, reproduction_id)  # ends, taken over
        assert first.status is JobStatus.RUNNING  # the second run's
        assert portal_view() == b"second runner\n"
    finally:
        first_ended.set()
        thread.join(60)
    assert [(r.status, r.exit_code) for r in seconds] == [(JobStatus.SUCCEEDED, 0)]
    assert list((ctx.settings.home / reproductions.LIVE_LOG_DIR).iterdir()) == []


@pytest.mark.sqlite_only
def test_reconcile_leaves_a_reproductions_workspace_to_its_runner_while_it_is_destroyed(
    ctx: Context,
) -> None:
    """The scheduler's reconcile runs while a reproduction's runner destroys its workspace: the
    container is gone, the row still says running. Reconcile took it for dead and restarted it,
    making the container again and mounting the volume's disk image (`infra.disk_images`)
    while the runner removed it: the interleaving that left `mnt/data` on the host's disk and
    the volume behind. Now it leaves the workspace alone; the runner removes it, once."""
    with ctx.session() as session:
        session.add(Host(name="engine", docker_url="unix:///run/engine.sock", healthy=True))
    engine = FakeEngine()
    reports: list[workspaces.ReconcileReport] = []

    def reconcile_meanwhile() -> None:
        with ctx.session() as session:
            reports.append(workspaces.reconcile(session, engine.factory))

    engine.meanwhile = reconcile_meanwhile
    with reproductions.disposable_workspace(
        ctx, image="img", hardware_profile="cpu", purpose=WorkspacePurpose.REPRODUCTION,
        network="none", backend_factory=engine.factory,
    ) as placed:  # fmt: skip
        name = placed.handle.name
        reconcile_meanwhile()  # while it runs: nothing to do either
    assert engine.calls == [
        f"create {name}", f"start {name}", f"remove container {name}",
        f"remove volume {name}-submission",
    ]  # fmt: skip
    assert [(r.died, r.restarted, r.errors) for r in reports] == [([], [], {})] * 2
    with ctx.session() as session:
        workspace = session.scalar(select(Workspace).where(Workspace.name == name))
        assert workspace is not None and workspace.status is WorkspaceStatus.DESTROYED


@pytest.mark.sqlite_only
def test_the_worker_skips_a_reproduction_another_runner_claimed_after_it_was_listed(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`baseline reproduce` claimed it between the worker's listing and its turn: the worker
    leaves it to that runner (no error, no failed try), and goes on."""
    reproduction_id = _queued_reproduction(ctx, tmp_path)
    listed = orchestration._queued

    def listed_then_claimed(*args: object, **kwargs: object) -> list[object]:
        rows = listed(*args, **kwargs)  # type: ignore[arg-type]
        with ctx.session() as session:
            row = session.get(Reproduction, reproduction_id)
            assert row is not None
            if row.status is JobStatus.QUEUED:
                row.status, row.started_at = JobStatus.RUNNING, utcnow()
        return rows

    monkeypatch.setattr(orchestration, "discover", lambda *_a, **_k: None)
    monkeypatch.setattr(orchestration, "_queued", listed_then_claimed)
    report = orchestration.process_queue(ctx)
    assert report.reproductions == {} and report.errors == []
    with ctx.session() as session:
        row = session.get(Reproduction, reproduction_id)
        assert row is not None and row.status is JobStatus.RUNNING and row.tries == 0


class _ReproduceShBackend:
    """Stands for a reproduction workspace's backend: reproduce.sh prints a line and goes on
    until the workspace is stopped (or `longest_s` passes: then it ends as if it had finished)."""

    longest_s = 5.0

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.stopped_by: list[str] = []
        self.commands: list[str] = []

    def exec(
        self, _handle: object, command: list[str], *, on_output: Any = None, **_kw: object
    ) -> None:
        self.commands.append(" ".join(command))
        if on_output is not None:
            on_output(b"training epoch 1\n")
        self.stopped.wait(self.longest_s)

    def stop(self, _handle: object) -> None:
        self.stopped_by.append(threading.current_thread().name)
        self.stopped.set()


@pytest.mark.sqlite_only("the runner's own threads and stand-ins; the claim runs on both above")
def test_a_reproduction_runner_that_cannot_record_its_heartbeat_stops_reproduce_sh_in_time(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database stays locked for the heartbeat: the runner ran reproduce.sh on past the
    stale time, recovery queued the row again and the next runner ran it in a second workspace
    beside the first. Now, silent for `GIVE_UP_AFTER_S` (half the stale time), the runner stops
    its workspace from the heartbeat's thread, so reproduce.sh ends, runs nothing more there,
    removes its live log and leaves the row to recovery."""
    reproduction_id = _queued_reproduction(ctx, tmp_path)
    backend = _ReproduceShBackend()

    @contextmanager
    def placed(ctx: Context, **_kwargs: object) -> Iterator[reproductions.Placed]:
        yield reproductions.Placed(0, backend, SimpleNamespace(name="ws-1"))  # type: ignore[arg-type]

    def reproduce(workspace: Any, handle: Any, *_args: object, **kw: Any) -> ReproductionResult:
        workspace.exec(handle, ["bash", "reproduce.sh"], on_output=kw["on_output"])
        workspace.exec(handle, ["git", "status"])  # what follows the script
        return _result(0)

    def locked(_heartbeat: object) -> bool:
        if not backend.commands:  # recorded until the command runs, however slow the start
            return True
        raise OperationalError("UPDATE reproductions", {}, Exception("database is locked"))

    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.01)
    monkeypatch.setattr(claims, "GIVE_UP_AFTER_S", 0.2, raising=False)
    monkeypatch.setattr(claims.Heartbeat, "_record", locked, raising=False)
    monkeypatch.setattr(reproductions, "disposable_workspace", placed)
    monkeypatch.setattr(reproductions, "reproduce_in_workspace", reproduce)
    started = time.monotonic()
    with pytest.raises(Conflict, match=r"no heartbeat recorded for .* s; run given up"):
        reproductions.run_reproduction(ctx, reproduction_id)
    assert time.monotonic() - started < backend.longest_s  # stopped, not run to its end
    assert backend.commands == ["bash reproduce.sh"]
    assert backend.stopped_by == [f"reproduction-{reproduction_id}-heartbeat"]
    assert list((ctx.settings.home / reproductions.LIVE_LOG_DIR).iterdir()) == []
    with ctx.session() as session:
        row = session.get(Reproduction, reproduction_id)
        assert row is not None
        assert (row.status, row.tries, row.exit_code) == (JobStatus.RUNNING, 0, None)
    later = utcnow() + timedelta(seconds=claims.STALE_AFTER_S + 1)
    assert reproductions.recover_interrupted(ctx, now=later) == [reproduction_id]


def _left_live_log(ctx: Context, reproduction_id: int, claim: Any) -> Path:
    """The live log a runner killed after it opened it left behind."""
    path = reproductions.live_log_path(ctx.settings, reproduction_id, claim)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"started\n")
    return path


@pytest.mark.sqlite_only("files beside the row; the claim runs on both above")
def test_recovery_removes_the_live_logs_of_every_claim_it_takes_over(
    ctx: Context, tmp_path: Path
) -> None:
    """A runner taken over before it opened its live log, then killed after it did, left the
    file behind for good: recovery removed only the file of the claim it took over. Now it
    removes those of that claim and every earlier one of the row; another row's stays."""
    reproduction_id = _queued_reproduction(ctx, tmp_path)
    stale = utcnow() - timedelta(seconds=claims.STALE_AFTER_S + 60)
    earlier = _left_live_log(ctx, reproduction_id, stale - timedelta(hours=1))
    own = _left_live_log(ctx, reproduction_id, stale)
    other_row = _left_live_log(ctx, reproduction_id + 10, stale - timedelta(hours=1))
    with ctx.session() as session:
        row = session.get(Reproduction, reproduction_id)
        assert row is not None
        row.status, row.started_at, row.heartbeat_at = JobStatus.RUNNING, stale, stale
    assert reproductions.recover_interrupted(ctx) == [reproduction_id]
    assert not own.exists() and not earlier.exists()
    assert other_row.exists()


def test_a_run_that_ends_removes_the_live_logs_earlier_claims_left_behind(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live log left by a killed runner of an earlier claim stayed on the portal's disk after
    the row's next run ended; now that run removes it with its own."""
    reproduction_id = _queued_reproduction(ctx, tmp_path)
    left = _left_live_log(ctx, reproduction_id, utcnow() - timedelta(hours=1))
    monkeypatch.setattr(reproductions, "disposable_workspace", _no_workspace)
    monkeypatch.setattr(reproductions, "reproduce_in_workspace", lambda *_a, **_k: _result(0))
    assert reproductions.run_reproduction(ctx, reproduction_id).status is JobStatus.SUCCEEDED
    assert not left.exists()
    assert list((ctx.settings.home / reproductions.LIVE_LOG_DIR).iterdir()) == []


@pytest.mark.sqlite_only("the order of two transactions, on a fake engine")
def test_a_reproduction_names_its_workspace_before_the_container_stands(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner committed the workspace's row with its container standing, and named it on
    its reproduction only in the next transaction: a runner dying in between left a container
    (and its GPUs) that no row named, for the sweep to find only after its grace. Now the name
    is on the reproduction before the container is made."""
    reproduction_id = _queued_reproduction(ctx, tmp_path)
    with ctx.session() as session:
        session.add(Host(name="engine", docker_url="unix:///run/engine.sock", healthy=True))
    engine = FakeEngine()
    named_at_create: list[object] = []

    def read_the_row() -> None:
        with ctx.session() as session:
            row = session.get(Reproduction, reproduction_id)
            assert row is not None
            named_at_create.append(row.details.get("workspace"))

    engine.on_create = read_the_row
    monkeypatch.setattr(reproductions, "reproduce_in_workspace", lambda *_a, **_k: _result(0))
    reproductions.run_reproduction(ctx, reproduction_id, backend_factory=engine.factory)
    created = [call.removeprefix("create ") for call in engine.calls if call.startswith("create")]
    assert named_at_create == created and len(created) == 1


@pytest.mark.sqlite_only("statements recorded; the allocator's queries run on both elsewhere")
def test_a_reproduction_with_no_room_for_its_workspace_writes_nothing_and_names_nothing(
    ctx: Context,
) -> None:
    """While a GPU profile's GPUs were all taken, each try of a reproduction (one a minute for
    as long as they stayed taken) named a workspace on the job's row, then inserted it, found no
    room and rolled it back: writes on the database for nothing, and a job row naming a
    workspace that never stood. Now it asks first, read only, and writes nothing."""
    with ctx.session() as session:
        full_gpu_host(session)

    def no_engine(_host: Host) -> WorkspaceBackend:
        raise AssertionError("no engine is needed to find that there is no room")

    named: list[str] = []
    with (
        recording_writes(ctx.engine) as written,
        pytest.raises(reproductions.NoRoom, match="no workspace for the reproduction: no "),
        reproductions.disposable_workspace(
            ctx,
            image="x",
            hardware_profile="a10",
            purpose=WorkspacePurpose.REPRODUCTION,
            network="none",
            backend_factory=no_engine,
            on_named=named.append,
        ),
    ):
        raise AssertionError("placed without a free GPU")
    assert (written, named) == ([], [])


def test_a_reproduction_waiting_for_gpus_holds_back_only_those_that_would_take_the_same(
    ctx: Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue stopped at the first reproduction that found no room: one on a CPU profile got
    no score while an earlier one waited for GPUs that participants held, for days maybe. A
    pass now goes on past it, and leaves only the later ones that need the same GPU model
    (FIFO among them: a later one must not take the GPU an earlier one waits for)."""
    world = build_world(ctx, image_digest="sha256:" + "a" * 64)
    queued: dict[str, int] = {}
    for name, attempt_id, kind in (
        ("a10 first", world.attempt_id, SnapshotKind.CHECKPOINT),
        ("a10 second", world.attempt_id, SnapshotKind.FINAL),
        ("cpu", world.agent_attempt_id, SnapshotKind.FINAL),
    ):
        folder = tmp_path / name.replace(" ", "-")
        snapshot_id = snapshot_reference(ctx, attempt_id, folder, kind=kind, due_working_s=1.0)
        with ctx.session() as session:
            snapshot = session.get(Snapshot, snapshot_id)
            assert snapshot is not None
            queued[name] = reproductions.queue_reproduction(session, snapshot).id
    with ctx.session() as session:
        human = session.get(Attempt, world.attempt_id)
        assert human is not None
        human.hardware_profile = "a10"  # one NVIDIA A10, none free
    placed: list[str] = []

    @contextmanager
    def a10_taken(ctx: Context, **options: Any) -> Iterator[reproductions.Placed]:
        placed.append(options["hardware_profile"])
        if options["hardware_profile"] == "a10":
            raise reproductions.NoRoom("no workspace for the reproduction: no GPU free")
        with _no_workspace(ctx) as stand_in:
            yield stand_in

    def ran(*_args: object, **_kwargs: object) -> None:
        raise MemoryError("ran")  # a failed try: enough to see that it ran

    monkeypatch.setattr(reproductions, "disposable_workspace", a10_taken)
    monkeypatch.setattr(reproductions, "reproduce_in_workspace", ran)
    monkeypatch.setattr(orchestration, "discover", lambda *_a, **_k: None)
    report = orchestration.process_queue(ctx)
    assert placed == ["a10", "cpu"]  # the second A10 one left in the queue, untried
    with ctx.session() as session:
        rows = {name: session.get(Reproduction, row_id) for name, row_id in queued.items()}
        first, second, cpu = rows["a10 first"], rows["a10 second"], rows["cpu"]
        assert first is not None and second is not None and cpu is not None
        assert first.status is JobStatus.QUEUED and "no GPU free" in first.details["waiting"]
        assert second.status is JobStatus.QUEUED and second.tries == 0
        assert "waiting" not in second.details
        assert cpu.tries == 1 and "MemoryError: ran" in (cpu.error or "")
    assert report.errors == [
        f"reproduction {queued['a10 first']}: no workspace for the reproduction: no GPU free",
        f"reproduction {queued['cpu']}: try 1 of 3 failed (MemoryError: ran); retrying",
    ]
