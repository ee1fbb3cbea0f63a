"""Lateness of snapshots with 1,000 concurrent time-scaled attempts on one scheduler.

1,000 agent attempts start within a few seconds of each other, each with checkpoints at 0.5, 1
and 1.5 working hours and a 2-hour limit, at a time scale that makes an attempt last about 30 wall
seconds. The real `SnapshotScheduler` (APScheduler with its SQLAlchemy job store) captures each
attempt's small submission folder at every point. Lateness of a snapshot = (working time when
taken - due working time) / time scale, in wall seconds. Printed: p50, p99 and max lateness, and
how many snapshots were taken against how many were due. Temporary folder, removed at the end.

    .venv/bin/python benchmarks/bench_schedule.py [--attempts 1000] [--attempt-wall-s 30]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from baseline import migrate
from baseline.attempts import attempts
from baseline.attempts.snapshots import DirectorySource, SubmissionSource
from baseline.config import Settings
from baseline.context import Context
from baseline.jobs.scheduler import SnapshotScheduler
from baseline.models import Attempt, Snapshot, SnapshotKind, Task, TaskKind
from baseline.studies import studies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=1000)
    parser.add_argument("--attempt-wall-s", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--database-url", help="default: SQLite in the temporary folder")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-schedule-"))
    try:
        home = work / "home"
        url = args.database_url or f"sqlite:///{work / 'bench.db'}"
        migrate.upgrade(url)
        ctx = Context.from_settings(Settings(home=home, database_url=url, secret_key="bench"))
        submission = work / "submission"
        submission.mkdir()
        for index in range(5):
            (submission / f"file{index}.py").write_text(f"print({index})\n" * 50)
        scale = 2 * 3600 / args.attempt_wall_s
        with ctx.session() as session:
            study = studies.create_study(
                session,
                studies.StudySpec(
                    name="bench",
                    checkpoint_hours=(0.5, 1.0, 1.5),
                    working_time_limit_hours=2.0,
                    time_scale=scale,
                ),
                None,
            )
            task = Task(slug="bench", title="bench", kind=TaskKind.PAPER, content_hash="0" * 64)
            session.add(task)
            session.flush()
            studies.add_task(session, study, task, None)
            session.flush()
            session.refresh(study)
            ids = []
            for index in range(args.attempts):
                agent = studies.add_agent(
                    session, study, f"agent {index}", "basic", "m", "http://127.0.0.1:1", None, None
                )
                ids.append(studies.create_attempt(session, agent, task, None).id)

        def resolve(_session: Session, _attempt: Attempt) -> SubmissionSource:
            return DirectorySource(str(submission))

        runner = SnapshotScheduler(ctx, resolve, sweep_every_s=5.0, workers=args.workers)
        runner.start()
        started = time.perf_counter()
        for attempt_id in ids:
            attempts.start(ctx, attempt_id, None, resolve)
        print(
            f"started {len(ids)} attempts in {time.perf_counter() - started:.1f}s "
            f"(time scale {scale:g}: one attempt = {args.attempt_wall_s:g} wall s)"
        )
        due_total = len(ids) * 5  # start, three checkpoints, final
        deadline = time.monotonic() + args.attempt_wall_s * 4 + 60
        while time.monotonic() < deadline:
            with ctx.session() as session:
                ended = session.scalar(
                    select(func.count()).select_from(Attempt).where(Attempt.ended_at.is_not(None))
                )
            if ended == len(ids):
                break
            time.sleep(1.0)
        runner.shutdown()
        with ctx.session() as session:
            rows = list(session.scalars(select(Snapshot)))
        timed = [s for s in rows if s.kind in (SnapshotKind.CHECKPOINT, SnapshotKind.FINAL)]
        lateness = [(s.taken_working_s - s.due_working_s) / scale for s in timed]
        print(f"snapshots taken: {len(rows)} of {due_total} due; attempts ended: {ended}")
        print(f"lateness of {len(lateness)} checkpoint/final snapshots (wall seconds):")
        print(
            f"  p50 {statistics.median(lateness):.3f}  p99 {percentile(lateness, 0.99):.3f}  "
            f"max {max(lateness):.3f}  (= {percentile(lateness, 0.99) * scale / 60:.1f} "
            f"working minutes at p99 at this scale)"
        )
        print(f"  marked late (> grace): {sum(s.late for s in rows)}")
        ctx.engine.dispose()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
