"""Reproduction rows in the queue: whatever breaks, a row ends, with its error, and the queue
moves on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from baseline.context import Context
from baseline.grading import reproductions, retries
from baseline.jobs import orchestration
from baseline.models import JobStatus, Reproduction, Snapshot, SnapshotKind, utcnow
from tests.scoring.scoring_world import build_world, snapshot_reference


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
