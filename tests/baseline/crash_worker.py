"""The 'server process' of the crash test: runs the snapshot scheduler until the attempt ends.

Usage: python -m tests.baseline.crash_worker HOME DATABASE_URL ATTEMPT_ID SUBMISSION_DIR
The parent kills it with SIGKILL at random moments and starts it again.

Each start used to be a fresh interpreter, and importing the scheduler costs seconds of CPU on
a loaded CI machine: twenty restarts spent most of the test's time importing. The worker runs as
a fork server instead: it imports once, then forks one scheduler process per "start" line on its
stdin. Each fork is a real process that the parent SIGKILLs; only the imports are shared.
Protocol (one line each way): "start" -> "started PID" (and the child prints "ready PID" once
its start-up is over); "wait PID" -> "exited PID STATUS" with `os.waitpid`'s raw status.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sqlalchemy.orm import Session

from baseline.attempts.snapshots import DirectorySource, SubmissionSource
from baseline.config import Settings
from baseline.context import Context
from baseline.jobs.scheduler import SnapshotScheduler
from baseline.models import Attempt


def _say(line: str) -> None:
    """One line in one write: the fork server and its children share the pipe, and `print`
    writes a line and its end separately where stdout is unbuffered (PYTHONUNBUFFERED), so that
    a child's line could land between them ("started 18697ready 18697")."""
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


def main(home: str, database_url: str, attempt_id: int, submission: str) -> int:
    ctx = Context.from_settings(Settings(Path(home), database_url, secret_key="crash-test"))

    def resolve(_session: Session, _attempt: Attempt) -> SubmissionSource:
        return DirectorySource(submission)

    runner = SnapshotScheduler(ctx, resolve, sweep_every_s=0.2, late_grace_wall_s=0.5)
    _say(f"ready {os.getpid()}")  # start-up is over: a kill now lands in real work
    runner.start()
    try:
        while True:
            with ctx.session() as session:
                attempt = session.get(Attempt, attempt_id)
                if attempt is None or attempt.ended_at is not None:
                    return 0
            time.sleep(0.05)
    finally:
        runner.shutdown()


def serve(argv: list[str]) -> None:
    """Fork a worker per "start", reap one per "wait"; no database connection is opened here,
    so each child starts with none inherited."""
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "start":
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = main(argv[0], argv[1], int(argv[2]), argv[3])
                finally:
                    sys.stdout.flush()
                    os._exit(code)
            _say(f"started {pid}")
        elif command == "wait":
            pid, status = os.waitpid(int(rest[0]), 0)
            _say(f"exited {pid} {status}")


if __name__ == "__main__":
    serve(sys.argv[1:])
