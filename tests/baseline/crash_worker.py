"""The 'server process' of the crash test: runs the snapshot scheduler until the attempt ends.

Usage: python -m tests.baseline.crash_worker HOME DATABASE_URL ATTEMPT_ID SUBMISSION_DIR
The parent kills it with SIGKILL at random moments and starts it again.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from sqlalchemy.orm import Session

from baseline.config import Settings
from baseline.context import Context
from baseline.models import Attempt
from baseline.scheduler import SnapshotScheduler
from baseline.snapshots import DirectorySource, SubmissionSource


def main(home: str, database_url: str, attempt_id: int, submission: str) -> int:
    ctx = Context.from_settings(Settings(Path(home), database_url, secret_key="crash-test"))

    def resolve(_session: Session, _attempt: Attempt) -> SubmissionSource:
        return DirectorySource(submission)

    runner = SnapshotScheduler(ctx, resolve, sweep_every_s=0.2, late_grace_wall_s=0.5)
    print("ready", flush=True)  # imports done: the parent's kill now lands in real work
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
