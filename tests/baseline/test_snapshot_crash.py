"""SIGKILL the scheduler process at random points during 50 capture cycles (about 30 s each).

An attempt at 100 working seconds per wall second snapshots every working minute (0.6 wall s)
for 50 working minutes (30 wall s): start, 49 interval points, final. A writer keeps changing
the submission meanwhile. The scheduler process is killed with SIGKILL at random moments
(during start-up, catch-up, capture, commit) and restarted until the attempt has ended: up to
KILLS times, and at least MIN_KILLS times however slow the machine is (each restart costs a
Python start-up, so a loaded machine fits fewer kills into the attempt's 30 wall seconds).
Afterwards every due snapshot exists exactly once and `baseline snapshot verify` re-hashes all
of them intact.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from baseline import attempts
from baseline.context import Context
from baseline.models import Attempt, AttemptStatus
from tests.baseline.attempt_world import directory_resolver, make_attempt

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCALE = 100.0
KILLS = 20
MIN_KILLS = 10


def _writer(root: Path, stop: threading.Event) -> None:
    rng = random.Random(7)
    for index in range(300):
        (root / f"f{index:03}.bin").write_bytes(rng.randbytes(20_000))
    while not stop.is_set():
        for _ in range(5):
            name = root / f"f{rng.randrange(300):03}.bin"
            name.write_bytes(rng.randbytes(rng.randrange(1000, 40_000)))
        time.sleep(0.02)


def test_sigkill_during_capture_cycles_loses_nothing(ctx: Context, tmp_path: Path) -> None:
    submission = tmp_path / "submission"
    submission.mkdir()
    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(submission, stop), daemon=True)
    writer.start()
    attempt_id = make_attempt(
        ctx, checkpoints=[], interval_minutes=1, limit_hours=50 / 60, time_scale=SCALE
    )
    attempts.start(ctx, attempt_id, None, directory_resolver(submission))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [
        sys.executable,
        "-m",
        "tests.baseline.crash_worker",
        str(ctx.settings.home),
        ctx.settings.database_url,
        str(attempt_id),
        str(submission),
    ]
    rng = random.Random(1234)
    kills = 0
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            child = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE)
            if kills < KILLS:
                assert child.stdout is not None
                child.stdout.readline()  # "ready": start-up is over, catch-up and captures begin
                time.sleep(rng.uniform(0.0, 0.5))
                if child.poll() is None:
                    child.send_signal(signal.SIGKILL)
                    child.wait()
                    kills += 1
                    continue
            code = child.wait(timeout=max(deadline - time.monotonic(), 1))
            assert code == 0, f"worker exited with {code}"
            with ctx.session() as session:
                attempt = session.get(Attempt, attempt_id)
                assert attempt is not None
                if attempt.ended_at is not None:
                    break
    finally:
        stop.set()
        writer.join()
    assert MIN_KILLS <= kills <= KILLS

    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.ENDED
        points = sorted((s.kind.value, round(s.due_working_s)) for s in attempt.snapshots)
        late = sum(s.late for s in attempt.snapshots)
    expected = sorted(
        [("start", 0), ("final", 3000)] + [("interval", 60 * i) for i in range(1, 50)]
    )
    assert points == expected  # every due snapshot, each exactly once
    assert late > 0  # some fell due while no scheduler was running and were caught up

    verify = subprocess.run(
        [sys.executable, "-c", "from baseline.cli import main; main()", "snapshot", "verify"],
        cwd=REPO,
        env={
            **env,
            "BASELINE_HOME": str(ctx.settings.home),
            "BASELINE_DATABASE_URL": ctx.settings.database_url,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "51 of 51 snapshots intact" in verify.stdout
