"""Several portal processes on one database: exactly one runs the scheduler, another takes over.

The locks are tested directly (advisory lock on PostgreSQL, flock on SQLite), then two real
processes share a time-scaled attempt (on PostgreSQL when it is configured: SQLite stays the
single-process default, see POSTGRES_ONLY_TESTS in tests/conftest.py): one leads, the other
stands by; the leader is SIGKILLed in the middle of the attempt, the other takes the lead within
the poll bound, and every due snapshot exists exactly once at the end.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest
from sqlalchemy import create_engine

from baseline.attempts import attempts
from baseline.context import Context
from baseline.jobs.leadership import AdvisoryLock, FileLock, LeaderElection, lock_for
from baseline.models import Attempt, AttemptStatus
from tests.baseline.attempt_world import directory_resolver, make_attempt
from tests.docker_env import unavailable

REPO = Path(__file__).resolve().parents[3]


def test_file_lock_is_exclusive_and_dies_with_its_holder(tmp_path: Path) -> None:
    first, second = FileLock(tmp_path / "l"), FileLock(tmp_path / "l")
    assert first.try_acquire()
    assert not second.try_acquire()
    first.release()
    assert second.try_acquire()
    second.release()
    # A holder process that dies (SIGKILL, no clean-up) lets the lock go.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time; from baseline.jobs.leadership import FileLock; "
            f"FileLock(__import__('pathlib').Path({str(tmp_path / 'l')!r})).try_acquire(); "
            "print('held', flush=True); time.sleep(60)",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    assert not first.try_acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert first.try_acquire()
    first.release()


def test_lock_for_picks_the_database_kind(ctx: Context, tmp_path: Path) -> None:
    lock = lock_for(ctx.engine, tmp_path)
    if ctx.engine.url.get_backend_name() == "postgresql":
        assert isinstance(lock, AdvisoryLock)
    else:
        assert isinstance(lock, FileLock)


@pytest.mark.postgres
def test_advisory_lock_is_exclusive_and_released_when_the_connection_dies() -> None:
    url = os.environ.get("BASELINE_TEST_POSTGRES_URL", "")
    if not url:
        unavailable("BASELINE_TEST_POSTGRES_URL is not set (scripts/services/10-postgres.sh)")
    key = random.getrandbits(62)  # no other test run holds this lock
    first_engine, second_engine = create_engine(url), create_engine(url)
    try:
        first, second = AdvisoryLock(first_engine, key=key), AdvisoryLock(second_engine, key=key)
        assert first.try_acquire()
        assert first.still_held()
        assert not second.try_acquire()
        # The holder's connection is cut as a crash would cut it: the server drops the lock.
        assert first._connection is not None
        first._connection.invalidate()
        first._connection = None
        deadline = time.monotonic() + 10
        while not second.try_acquire():
            assert time.monotonic() < deadline, "the lock outlived its connection"
            time.sleep(0.1)
        assert not first.still_held()
        second.release()
    finally:
        first_engine.dispose()
        second_engine.dispose()


def test_election_steps_down_when_the_lock_is_lost(tmp_path: Path) -> None:
    class Flaky(FileLock):
        broken = False

        def still_held(self) -> bool:
            return not self.broken and super().still_held()

    lock = Flaky(tmp_path / "l")
    events: list[str] = []

    def start() -> str:
        events.append("start")
        return "run"

    election: LeaderElection[str] = LeaderElection(
        lock, start=start, stop=events.append, poll_s=0.05
    )
    election.begin()
    assert election.leading and events == ["start"]
    lock.broken = True
    deadline = time.monotonic() + 5
    while election.leading:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert events == ["start", "run"]
    lock.broken = False
    lock.release()
    assert election.became_leader.wait(5)
    election.end()
    assert events == ["start", "run", "start", "run"]


def _snapshot_count(ctx: Context, attempt_id: int) -> int:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        return len(attempt.snapshots)


def _lines(stream: IO[str], into: queue.Queue[tuple[float, str]]) -> None:
    for line in stream:
        into.put((time.monotonic(), line.strip()))


@pytest.mark.slow
def test_two_processes_take_each_checkpoint_once_and_survive_the_leader_dying(
    ctx: Context, tmp_path: Path
) -> None:
    submission = tmp_path / "submission"
    submission.mkdir()
    (submission / "work.txt").write_text("hello\n")
    # 100 working s per wall s, a snapshot every working minute (0.6 wall s apart) for 90
    # working minutes (54 wall s): long enough for a takeover on a loaded machine.
    attempt_id = make_attempt(
        ctx, checkpoints=[], interval_minutes=1, limit_hours=90 / 60, time_scale=100.0
    )
    attempts.start(ctx, attempt_id, None, directory_resolver(submission))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    outputs: queue.Queue[tuple[float, str]] = queue.Queue()
    children: dict[str, subprocess.Popen[str]] = {}
    for name in ("a", "b"):
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.baseline.leader_worker",
                name,
                str(ctx.settings.home),
                ctx.settings.database_url,
                str(attempt_id),
                str(submission),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        threading.Thread(target=_lines, args=(child.stdout, outputs), daemon=True).start()
        children[name] = child
    try:
        leaders: list[tuple[float, str]] = []
        deadline = time.monotonic() + 60
        while not leaders:
            when, line = outputs.get(timeout=max(deadline - time.monotonic(), 0.1))
            if line.startswith("leader "):
                leaders.append((when, line.split()[1]))
        first = leaders[0][1]
        deadline = time.monotonic() + 60
        while _snapshot_count(ctx, attempt_id) < 5:  # the leader has been at work for a while
            assert time.monotonic() < deadline, "the leader took no snapshots"
            time.sleep(0.2)
        # While both lived, only one led.
        while not outputs.empty():
            when, line = outputs.get()
            assert not line.startswith("leader "), f"a second leader while the first lived: {line}"
        killed_at = time.monotonic()
        children[first].send_signal(signal.SIGKILL)
        children[first].wait()
        second = "b" if first == "a" else "a"
        when, line = outputs.get(timeout=30)
        while not line.startswith("leader "):
            when, line = outputs.get(timeout=30)
        assert line == f"leader {second}"
        takeover_s = when - killed_at
        assert takeover_s < 10, f"takeover took {takeover_s:.1f} s"
        assert children[second].wait(timeout=120) == 0
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()

    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.ENDED
        points = sorted((s.kind.value, round(s.due_working_s)) for s in attempt.snapshots)
    expected = sorted(
        [("start", 0), ("final", 5400)] + [("interval", 60 * i) for i in range(1, 90)]
    )
    assert points == expected  # every due snapshot, each exactly once, across the takeover
