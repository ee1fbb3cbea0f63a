"""The background scheduler (APScheduler 3.x) that runs in the portal's process.

Jobs persist in the study database through APScheduler's SQLAlchemy job store, so due work
survives a restart of the portal. Each live attempt has one job, at the wall time of its next due
point (`baseline.attempts.schedule.next_wall_time`); when it fires, every due snapshot is taken and
the job is set to the next point. A pause moves the due times, so pausing or resuming tells the
scheduler (`baseline.attempts.clock_listener`), which recomputes the job at once in this process; a
sweep job recomputes every live attempt every few seconds, which covers changes made by another
process (the CLI). On start every live attempt is caught up first: what fell due while the portal
was down is taken then and marked late.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
from datetime import timedelta

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED
from sqlalchemy import select

from baseline.attempts import clock_listener, host_outage, schedule
from baseline.attempts.snapshots import SourceResolver
from baseline.context import Context
from baseline.grading import grading_recovery, reproductions
from baseline.jobs import leadership
from baseline.models import LIVE_ATTEMPT_STATUSES, Attempt, utcnow
from baseline.workspaces import egress_gateway

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5.0
SWEEP_EVERY_S = 10.0
RECONCILE_EVERY_S = 60.0
HUB_WATCH_EVERY_S = 15.0
ALERTS_EVERY_S = 30.0


class _StoppableScheduler(BackgroundScheduler):
    """APScheduler's loop, woken by its shutdown or by a job falling due at that moment, goes
    through the due jobs once more: it looks at the state only before it waits. A job due then
    was submitted to the executor the shutdown had just closed ("cannot schedule new futures
    after shutdown", logged with its traceback), and the loop's thread died on removing that job
    (seen in the demo's shutdown). Here a stopped scheduler processes nothing; the state is
    looked at under the job stores' lock, which the shutdown takes after setting it."""

    def _process_jobs(self) -> float | None:
        with self._jobstores_lock:
            if self.state == STATE_STOPPED:
                return None
            try:
                wait_s: float | None = super()._process_jobs()
            except JobLookupError as exc:
                # A date job it had just run was gone when it went to remove it (the job store is
                # a shared table: seen at the demo's shutdown). The exception killed the loop's
                # thread, and with it every checkpoint after; the next pass reads the due jobs
                # again at once.
                log.warning("scheduler: %s; looking at the due jobs again", exc)
                return 0.0
            return wait_s


def make_scheduler(ctx: Context, workers: int = 10) -> BackgroundScheduler:
    return _StoppableScheduler(
        jobstores={"default": SQLAlchemyJobStore(engine=ctx.engine, tablename="scheduler_jobs")},
        executors={"default": ThreadPoolExecutor(workers)},
        job_defaults={"coalesce": True, "misfire_grace_time": None, "max_instances": 1},
        timezone="UTC",
    )


def _job_id(attempt_id: int) -> str:
    return f"attempt-{attempt_id}"


class SnapshotScheduler:
    """Keeps one APScheduler job per live attempt at its next due wall time."""

    def __init__(
        self,
        ctx: Context,
        resolver: SourceResolver,
        sweep_every_s: float = SWEEP_EVERY_S,
        workers: int = 10,
        late_grace_wall_s: float = schedule.LATE_GRACE_WALL_S,
    ) -> None:
        self.ctx = ctx
        self.resolver = resolver
        self.sweep_every_s = sweep_every_s
        self.late_grace_wall_s = late_grace_wall_s
        self.scheduler = make_scheduler(ctx, workers)
        self._locks: dict[int, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _lock(self, attempt_id: int) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(attempt_id, threading.Lock())

    def live_attempt_ids(self) -> list[int]:
        with self.ctx.session() as session:
            return list(
                session.scalars(
                    select(Attempt.id).where(
                        Attempt.status.in_(LIVE_ATTEMPT_STATUSES), Attempt.started_at.is_not(None)
                    )
                )
            )

    def start(self) -> None:
        """Catch up every live attempt (late snapshots), then schedule them and run."""
        global _ACTIVE
        _ACTIVE = self
        clock_listener.listen(self.reschedule)
        self.scheduler.start(paused=True)
        for attempt_id in self.live_attempt_ids():
            self.run(attempt_id)
        self.scheduler.add_job(
            "baseline.jobs.scheduler:_sweep_job",
            "interval",
            seconds=self.sweep_every_s,
            id="snapshot-sweep",
            replace_existing=True,
        )
        self.scheduler.resume()

    def add_periodic(self, ref: str, seconds: float, job_id: str) -> None:
        """Run ``module:function(ctx)`` every ``seconds`` (persisted; the ctx is this process's)."""
        self.scheduler.add_job(
            "baseline.jobs.scheduler:_context_job",
            "interval",
            seconds=seconds,
            args=[ref],
            id=job_id,
            replace_existing=True,
        )

    def shutdown(self, wait: bool = True) -> None:
        """Stop; with `wait`, return only after every snapshot run in flight has finished.

        APScheduler's own `shutdown(wait=True)` waits for running jobs while holding its job-store
        lock, and a snapshot run re-arms its job (which needs that lock) before it returns: the
        two would deadlock. So the scheduler stops without waiting, and the runs in flight are
        awaited through their per-attempt locks, which they hold until they are done.
        """
        global _ACTIVE
        self.scheduler.shutdown(wait=False)
        if wait:
            with self._locks_guard:
                locks = list(self._locks.values())
            for lock in locks:
                with lock:
                    pass
        clock_listener.stop_listening(self.reschedule)
        if _ACTIVE is self:
            _ACTIVE = None
            egress_gateway.shutdown()  # the proxy is this process's child

    def run(self, attempt_id: int) -> None:
        """Take what is due for one attempt, then set its job to the next due time."""
        with self._lock(attempt_id):
            try:
                schedule.run_due(
                    self.ctx,
                    attempt_id,
                    self.resolver,
                    late_grace_wall_s=self.late_grace_wall_s,
                )
            except Exception:
                # The workspace may be down or the disk full: never lose the point, retry soon.
                log.exception("snapshot of attempt %s failed; retrying", attempt_id)
                self._set_job(attempt_id, utcnow() + timedelta(seconds=RETRY_AFTER_S))
                return
            self.reschedule(attempt_id)

    def reschedule(self, attempt_id: int) -> None:
        with self.ctx.session() as session:
            attempt = session.get(Attempt, attempt_id)
            when = None if attempt is None else schedule.next_wall_time(attempt)
        self._set_job(attempt_id, when)

    def _set_job(self, attempt_id: int, when: object) -> None:
        job_id = _job_id(attempt_id)
        if when is None:
            with contextlib.suppress(JobLookupError):
                self.scheduler.remove_job(job_id)
            return
        existing = self.scheduler.get_job(job_id)
        if existing is not None and existing.next_run_time == when:
            return
        self.scheduler.add_job(
            "baseline.jobs.scheduler:_attempt_job",
            "date",
            run_date=when,
            args=[attempt_id],
            id=job_id,
            replace_existing=True,
            # A job re-arms itself before it returns; the per-attempt lock serialises the runs,
            # so a new firing must never be dropped because the old one is still finishing.
            max_instances=8,
        )

    def sweep(self) -> None:
        for attempt_id in self.live_attempt_ids():
            with self._lock(attempt_id):
                self.reschedule(attempt_id)


_ACTIVE: SnapshotScheduler | None = None


def _attempt_job(attempt_id: int) -> None:
    if _ACTIVE is None:
        log.warning("attempt %s fell due but no snapshot scheduler is active", attempt_id)
        return
    _ACTIVE.run(attempt_id)


def _sweep_job() -> None:
    if _ACTIVE is not None:
        _ACTIVE.sweep()


def _context_job(ref: str) -> None:
    if _ACTIVE is None:
        return
    module_name, _, name = ref.partition(":")
    getattr(importlib.import_module(module_name), name)(_ACTIVE.ctx)


def start_scheduler(ctx: Context, resolver: SourceResolver | None = None) -> SnapshotScheduler:
    from baseline.attempts.snapshots import resolve_source
    from baseline.jobs.orchestration import start_worker

    runner = SnapshotScheduler(ctx, resolver or resolve_source)
    runner.start()
    # Reproductions whose process stopped mid-run (no heartbeat) are cleaned up and queued again.
    reproductions.recover_job(ctx)
    runner.add_periodic(
        "baseline.grading.reproductions:recover_job", RECONCILE_EVERY_S, "recover-reproductions"
    )
    # Gradings likewise (`baseline.grading.grading_recovery`).
    grading_recovery.recover_job(ctx)
    runner.add_periodic(
        "baseline.grading.grading_recovery:recover_job", RECONCILE_EVERY_S, "recover-gradings"
    )
    # Workspaces whose container died are restarted on their volume; orphans are removed.
    runner.add_periodic(
        "baseline.workspaces.workspaces:reconcile_job", RECONCILE_EVERY_S, "reconcile"
    )
    # A host that stops answering pauses its attempts (reason `outage`) until it answers again.
    runner.add_periodic(
        "baseline.attempts.host_outage:probe_job", host_outage.PROBE_EVERY_S, "host-outage"
    )
    # Attempts whose workspace was placed late (after a GPU freed up) start their clock here.
    runner.add_periodic(
        "baseline.attempts.launch:start_placed_attempts", RECONCILE_EVERY_S, "launch"
    )
    # The egress proxy is kept up and its log recorded as EgressEvent rows while the portal runs;
    # the blacklist monitor checks the attempts with new ones (humans' included).
    runner.add_periodic("baseline.runs.blacklist_monitor:egress_job", SWEEP_EVERY_S, "egress")
    # Hub-using attempts: outage pauses while the hub is down, idle pauses (baseline.hub.hub_watch).
    runner.add_periodic("baseline.hub.hub_watch:watch_job", HUB_WATCH_EVERY_S, "hub-watch")
    # The study monitor's alert rules: fired, cleared and delivered (baseline.monitor.alerts).
    runner.add_periodic("baseline.monitor.alerts:evaluate_job", ALERTS_EVERY_S, "monitor-alerts")
    # Every new snapshot is reproduced, then graded (judge or scoring script).
    start_worker(runner.scheduler, ctx)
    return runner


def lead_scheduler(
    ctx: Context, poll_s: float = leadership.POLL_S
) -> leadership.LeaderElection[SnapshotScheduler]:
    """Run the scheduler in this process only while it leads (see `baseline.jobs.leadership`).

    Several portal processes on one database each call this; exactly one of them runs the
    scheduler at a time, and another takes over within about `poll_s` when it dies.
    """
    election = leadership.LeaderElection(
        leadership.lock_for(ctx.engine, ctx.settings.home),
        start=lambda: start_scheduler(ctx),
        stop=lambda runner: runner.shutdown(wait=False),
        poll_s=poll_s,
    )
    election.begin()
    return election
