"""A 'portal process' of the leader test: a snapshot scheduler that runs only while it leads.

Usage: python -m tests.baseline.leader_worker NAME HOME DATABASE_URL ATTEMPT_ID SUBMISSION_DIR
Prints "ready", then "leader NAME" when it takes the lead; exits when the attempt has ended.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sqlalchemy.orm import Session

from baseline.attempts.snapshots import DirectorySource, SubmissionSource
from baseline.config import Settings
from baseline.context import Context
from baseline.jobs.leadership import LeaderElection, lock_for
from baseline.jobs.scheduler import SnapshotScheduler
from baseline.models import Attempt


def main(name: str, home: str, database_url: str, attempt_id: int, submission: str) -> int:
    ctx = Context.from_settings(Settings(Path(home), database_url, secret_key="leader-test"))

    def resolve(_session: Session, _attempt: Attempt) -> SubmissionSource:
        return DirectorySource(submission)

    def start() -> SnapshotScheduler:
        runner = SnapshotScheduler(ctx, resolve, sweep_every_s=0.2, late_grace_wall_s=0.5)
        runner.start()
        print(f"leader {name}", flush=True)
        return runner

    election = LeaderElection(
        lock_for(ctx.engine, ctx.settings.home),
        start=start,
        stop=lambda runner: runner.shutdown(),
        poll_s=0.5,
    )
    print("ready", flush=True)
    election.begin()
    try:
        while True:
            with ctx.session() as session:
                attempt = session.get(Attempt, attempt_id)
                if attempt is None or attempt.ended_at is not None:
                    return 0
            time.sleep(0.05)
    finally:
        election.end()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]))
