"""One runner at a time for a background job (a reproduction or a grading), and its signs of life.

The scheduler's worker, the CLI (`baseline reproduce`, `baseline score`, `baseline grading
run-queue`) and a second portal may all pick up the same queued row. A runner first claims it
(`claim`): one conditional UPDATE from the statuses it may start from to running, atomic on
SQLite and PostgreSQL alike, so a second runner finds it claimed and gets `NotQueued` ("already
running"), never a second run (a judge grading's every leaf paid twice, a second workspace). The
claim is named by the row's `started_at`; everything the runner writes later (heartbeats, its
result, a failed try) is written only while the row is still running under that claim
(`claimed`).

While it runs, a `Heartbeat` thread marks the row alive every `HEARTBEAT_S`. A row silent for
`STALE_AFTER_S` lost its process (killed, its machine down): `stale` lists those, and each job's
recovery takes them over (`reproductions.recover_interrupted`,
`grading_recovery.recover_interrupted`). Should the silent runner still live, its claim is gone.

A runner must not outlive its claim: one that still ran after recovery took its row over ran
the job twice (two workspaces holding GPUs, a judge's leaves paid twice) for a result its claim
then refused. So the heartbeat gives the run up (`Heartbeat.lost`) when the claim was taken over,
and when no beat could be recorded for `GIVE_UP_AFTER_S` (a database that stays busy): well
before anyone may take it over. It stops what the run runs (`Heartbeat.guard`), and the runner
raises `ClaimLost` where it next waits on its work, writing nothing: the row is recovery's.

Who destroys a job's disposable workspace (`workspaces.DISPOSABLE`; reconcile leaves those to
their job): the job itself when it ends (`reproductions.disposable_workspace`,
`family_environment._scoring_gpus`); recovery when its runner died (`remove_workspace`); and
`sweep_disposable`, from the gradings' recovery job, every one whose job no longer holds it: a
destroy that failed when its job ended (the host's engine did not answer) or a runner that died
before it named its workspace on its row. Nothing else would ever retry those, and their GPUs
stayed out of the pool for good.

An intermediate score (`ScoreLog`) has no queue and no claim to take: its row is written running
when the score is asked, its creation is its claim, and it beats the same `Heartbeat`; one
silent for `STALE_AFTER_S` is closed by recovery (`grading_recovery.recover_intermediate_scores`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Text, exists, or_, select, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import Session

from baseline import audit
from baseline.context import Context
from baseline.db import commit_step, rows_changed
from baseline.errors import Conflict, NotFound
from baseline.grading.retries import count_failed_try
from baseline.models import (
    Grading,
    JobStatus,
    Reproduction,
    ScoreLog,
    Workspace,
    WorkspaceStatus,
    utcnow,
)
from baseline.workspaces.workspaces import DISPOSABLE, BackendFactory, PlacementError, destroy
from infra.workspace import WorkspaceBackend, WorkspaceError, WorkspaceHandle

log = logging.getLogger(__name__)

HEARTBEAT_S = 15.0
STALE_AFTER_S = 120.0  # eight heartbeats missed: the runner is gone
# A runner that could record no heartbeat for this long gives its run up (`Heartbeat`). Half the
# stale time: its row may be taken over once silent for `STALE_AFTER_S`, and the other half is
# the margin for the beat that blocked on the busy database, and for stopping what the run runs,
# so that it has stopped before recovery can queue the job again.
GIVE_UP_AFTER_S = STALE_AFTER_S / 2
# A disposable workspace that no job names is swept only once this old (`sweep_disposable`).
# Every job names its workspace before the row is made (`disposable_workspace`'s `on_named`), so
# an unnamed one was left by a runner whose claim was lost before it could name it and whose
# destroy then failed, or by an older Baseline, which named a reproduction's in the transaction
# after the container stood: one swept in between was destroyed under a live runner.
UNNAMED_GRACE_S = 600.0

Job = Reproduction | Grading
JobModel = type[Reproduction] | type[Grading]
# What beats a heartbeat: the jobs, and an intermediate score while it is scored.
Run = Reproduction | Grading | ScoreLog
RunModel = JobModel | type[ScoreLog]


class NotQueued(Conflict):
    """The job is not queued (any more): another runner claimed it first, or it ended. What a
    second runner gets instead of running it twice."""


def noun(model: RunModel) -> str:
    """How a run is named in messages: "reproduction", "grading", "intermediate score"."""
    return "intermediate score" if model is ScoreLog else model.__name__.lower()


def not_queued(row: Job) -> NotQueued:
    """The refusal a runner gets for a row it may not claim, saying who holds it since when."""
    name = noun(type(row))
    if row.status is JobStatus.RUNNING:
        since = row.started_at.isoformat(timespec="seconds") if row.started_at else "?"
        beat = row.heartbeat_at.isoformat(timespec="seconds") if row.heartbeat_at else "none"
        return NotQueued(
            f"{name} {row.id} is already running (claimed at {since}, last sign of life "
            f"{beat}); not running it twice"
        )
    return NotQueued(f"{name} {row.id} is {row.status.value}, not queued")


class ClaimLost(NotQueued):
    """This runner gave its run up (`Heartbeat.lost`): its claim was taken over, or it could not
    show it was alive for `GIVE_UP_AFTER_S`. Nothing of the run is recorded by it; the row is
    left to the runner that took it over or to recovery, as for a runner that found it claimed."""


def _row(session: Session, model: RunModel, row_id: int) -> Run:
    row = cast(Run | None, session.get(model, row_id))
    if row is None:
        raise NotFound(f"no {noun(model)} {row_id}")
    return row


def claim(
    ctx: Context,
    model: JobModel,
    row_id: int,
    *,
    start_from: Collection[JobStatus] = (JobStatus.QUEUED,),
    **values: Any,
) -> datetime:
    """Take the row for this runner; the claim (its `started_at`).

    One conditional UPDATE (`start_from` -> running, with `values`): of two runners that both
    read it queued, only one changes the row, the other gets `NotQueued`. Reading the status and
    writing it in two steps let both through."""
    now = utcnow()
    with ctx.session() as session:
        done = session.execute(
            update(model)
            .where(model.id == row_id, model.status.in_(list(start_from)))
            .values(status=JobStatus.RUNNING, started_at=now, heartbeat_at=now, **values)
            .execution_options(synchronize_session=False)
        )
        if not rows_changed(done):
            raise not_queued(cast(Job, _row(session, model, row_id)))
    return now


def claimed(session: Session, model: RunModel, row_id: int, claim: datetime) -> Any:
    """The row while it is still running under this runner's `claim`, else None (logged): a
    runner whose claim was taken over must not write over the run that followed."""
    row = _row(session, model, row_id)
    if row.status is JobStatus.RUNNING and row.started_at == claim:
        return row
    log.warning(
        "%s %s: this runner's claim was taken over (the row is %s); its outcome is not recorded",
        *(noun(model), row_id, row.status.value if row.status is not None else "ended"),
    )
    return None


class Heartbeat:
    """Marks the row alive every `HEARTBEAT_S` from a thread of its own while the job runs (the
    job itself blocks on a workspace or a model endpoint for long); only while it is running under
    this runner's `claim`: a taken-over runner must not keep the next one's row looking alive.

    When the claim was taken over, or no beat was recorded for `GIVE_UP_AFTER_S`, the run is
    given up: `lost` is set and what `guard` wrapped is stopped from this thread (the runner's
    own may be blocked in a command for hours); the runner's thread raises `ClaimLost` at its
    next `check` or guarded call."""

    def __init__(self, ctx: Context, model: RunModel, row_id: int, claim: datetime) -> None:
        self.ctx, self.model, self.row_id, self.claim = ctx, model, row_id, claim
        self.stopped = threading.Event()
        self.lost = threading.Event()
        self.reason = ""
        self._stops: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self.thread = threading.Thread(
            target=self._beat, name=f"{noun(model)}-{row_id}-heartbeat", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        self.thread.join()

    def check(self) -> None:
        """Raise `ClaimLost` once the run was given up."""
        if self.lost.is_set():
            raise ClaimLost(f"{noun(self.model)} {self.row_id}: {self.reason}; run given up")

    def on_lost(self, stop: Callable[[], None]) -> None:
        """Call `stop` when the run is given up (at once if it was already)."""
        with self._lock:
            if not self.lost.is_set():
                self._stops.append(stop)
                return
        stop()

    def guard(self, backend: WorkspaceBackend, handle: WorkspaceHandle) -> WorkspaceBackend:
        """`backend` for the run in the workspace `handle`: once the run is given up, the
        workspace is stopped (so the command running in it ends) and every call raises
        `ClaimLost`, before it starts or when it returns, so nothing more runs there."""

        def stop() -> None:
            try:
                backend.stop(handle)
            except Exception:  # the workspace is destroyed afterwards, or by recovery
                log.exception("%s %s: its workspace not stopped", noun(self.model), self.row_id)

        self.on_lost(stop)
        return cast(WorkspaceBackend, _Guarded(backend, self))

    def _give_up(self, reason: str) -> None:
        log.warning("%s %s: %s; giving the run up", noun(self.model), self.row_id, reason)
        with self._lock:
            self.reason = reason
            self.lost.set()
            stops, self._stops = self._stops, []
        for stop in stops:
            stop()

    def _record(self) -> bool:
        """Mark the row alive; False when it is no longer running under this claim."""
        model = self.model
        with self.ctx.session() as session:
            beat = session.execute(
                update(model)
                .where(
                    model.id == self.row_id,
                    model.status == JobStatus.RUNNING,
                    model.started_at == self.claim,
                )
                .values(heartbeat_at=utcnow())
                .execution_options(synchronize_session=False)
            )
        return bool(rows_changed(beat))

    def _beat(self) -> None:
        recorded_at = time.monotonic()  # the claim itself was the first sign of life
        while not self.stopped.wait(HEARTBEAT_S):
            try:
                if self._record():
                    recorded_at = time.monotonic()
                    continue
            except Exception:  # a missed beat is only a beat; the database may be busy
                log.warning("%s %s: heartbeat not recorded", noun(self.model), self.row_id)
                silent = time.monotonic() - recorded_at
                if silent >= GIVE_UP_AFTER_S and not self.stopped.is_set():
                    self._give_up(f"no heartbeat recorded for {silent:.0f} s")
                    return
                continue
            if not self.stopped.is_set():  # not its own end
                log.warning(
                    "%s %s: this runner's claim was taken over; no more heartbeats",
                    *(noun(self.model), self.row_id),
                )
                self._give_up("this runner's claim was taken over")
            return


class _Guarded:
    """A workspace backend whose every call first and last checks that the run goes on
    (`Heartbeat.guard`)."""

    def __init__(self, backend: WorkspaceBackend, heartbeat: Heartbeat) -> None:
        self._backend, self._heartbeat = backend, heartbeat

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._backend, name)
        if not callable(found):
            return found
        heartbeat = self._heartbeat

        def guarded(*args: Any, **kwargs: Any) -> Any:
            heartbeat.check()
            try:
                return found(*args, **kwargs)
            finally:
                heartbeat.check()

        return guarded


def stale(session: Session, model: RunModel, now: datetime) -> Sequence[Any]:
    """Rows running with no sign of life for `STALE_AFTER_S`: their runner is gone."""
    cutoff = now - timedelta(seconds=STALE_AFTER_S)
    return session.scalars(
        select(model).where(
            model.status == JobStatus.RUNNING,
            or_(model.heartbeat_at.is_(None), model.heartbeat_at < cutoff),
        )
    ).all()


def silence(row: Run, now: datetime) -> str:
    """How long the row was silent, for its error: "for 130 s" (or "recorded" when never)."""
    last = row.heartbeat_at or row.started_at
    return f"for {(now - last).total_seconds():.0f} s" if last else "recorded"


def take_over(
    session: Session,
    row: Job,
    workspace: str | None,
    backend_factory: BackendFactory,
    now: datetime,
) -> bool:
    """Recovery's takeover of a `stale` row: its workspace destroyed, then `count_interrupted`;
    False (the row left running for the next round) while that workspace cannot be removed."""
    if not remove_workspace(session, workspace, backend_factory):
        return False
    count_interrupted(session, row, now)
    return True


def count_interrupted(session: Session, row: Job, now: datetime) -> None:
    """End a `stale` row's claim, once what it left is removed, and count the run as a failed
    try of Baseline's own, audited (`take_over`; a grading's recovery removes a family's scoring
    run itself, which is no workspace)."""
    silent = silence(row, now)
    row.started_at = row.heartbeat_at = None
    count_failed_try(row, f"interrupted: its process stopped (no sign of life {silent})", now)
    name = noun(type(row))
    audit.record(session, f"{name}.recovered", name, row.id, None)


def remove_workspace(session: Session, name: str | None, backend_factory: BackendFactory) -> bool:
    """Destroy the job's workspace by name, if it still stands; False when it cannot be now
    (its host is down): the job is then left running so that the next round tries again
    (queued first, nothing would ever remove that workspace)."""
    workspace = session.scalar(select(Workspace).where(Workspace.name == name)) if name else None
    if workspace is None or workspace.status is WorkspaceStatus.DESTROYED:
        return True
    try:
        destroy(session, workspace, backend_factory)
    except (PlacementError, WorkspaceError) as exc:
        log.warning("workspace %s not removed: %s", name, exc)
        return False
    return True


def held_names(session: Session) -> set[str]:
    """The workspaces that running jobs and intermediate scores name: their runners' (or
    recovery's, when stale)."""
    reproductions = session.scalars(
        select(Reproduction.details).where(Reproduction.status == JobStatus.RUNNING)
    )
    gradings = session.scalars(select(Grading.config).where(Grading.status == JobStatus.RUNNING))
    names = [(values or {}).get("workspace") for values in [*reproductions, *gradings]]
    scores = session.scalars(select(ScoreLog.workspace).where(ScoreLog.status == JobStatus.RUNNING))
    return {name for name in [*names, *scores] if isinstance(name, str)}


def _named_by_a_job(session: Session, name: str) -> bool:
    """Whether any job row or intermediate score, whatever its status, names the workspace (a
    job's JSON holds the name as a string: names are unique and random, so no other value
    matches it)."""
    quoted = f'"{name}"'
    return bool(
        session.scalar(
            select(
                exists().where(
                    sql_cast(Reproduction.details, Text).contains(quoted, autoescape=True)
                )
                | exists().where(sql_cast(Grading.config, Text).contains(quoted, autoescape=True))
                | exists().where(ScoreLog.workspace == name)
            )
        )
    )


def sweep_disposable(
    session: Session, backend_factory: BackendFactory, now: datetime | None = None
) -> list[str]:
    """Destroy every live disposable workspace whose job no longer holds it; the names
    destroyed.

    Held (left alone): one a running job or intermediate score names; such a runner may be
    alive, and a stale one is recovery's (`remove_workspace`). Destroyed: one that rows name
    but no running one (its job ended, or was claimed again for a new workspace), and one that
    no row names once `UNNAMED_GRACE_S` old.

    The workspaces are read before the jobs: one a runner names after the jobs were read was
    named before that, or is younger than the grace. A destroy that fails (the host's engine
    does not answer) leaves the row live, and the next sweep tries again."""
    now = now or utcnow()
    candidates = session.scalars(
        select(Workspace)
        .where(
            Workspace.purpose.in_(list(DISPOSABLE)),
            Workspace.status != WorkspaceStatus.DESTROYED,
        )
        .order_by(Workspace.id)
    ).all()
    if not candidates:
        return []
    held = held_names(session)
    cutoff = now - timedelta(seconds=UNNAMED_GRACE_S)
    swept: list[str] = []
    for workspace in candidates:
        if workspace.name in held:
            continue
        if workspace.created_at > cutoff and not _named_by_a_job(session, workspace.name):
            continue
        log.warning("workspace %s: its job no longer holds it; destroying it", workspace.name)
        if remove_workspace(session, workspace.name, backend_factory):
            swept.append(workspace.name)
        commit_step(session)  # one destroy at a time holds SQLite's write lock
    return swept
