"""The study monitor's data: one read of everything a coordinator checks each morning.

`study_board` answers, for one study at one instant: per attempt its state, working time, last
activity, last snapshot and grade, pauses and their reasons, and cost so far; per host its
health, free GPUs and running workspaces; the scoring queue's depth and age and its recent
failures; judge and agent spend against the study's budget; and the study's alerts. The portal's
page, `/api/v1` and `baseline study watch` all show this one model, and the alert rules
(`baseline.monitor.rules`) read it, so what fires is what the coordinator sees.

It is built with a fixed number of queries (no query per attempt), read as plain rows, so it
stays fast at 500 attempts and 20 hosts (`benchmarks/bench_monitor.py`). `version` is the board's
ETag from one aggregate query: a poll that holds the current version costs that query only.

"Last activity" is the latest sign of work Baseline records: the attempt's start, first login or
resume, an agent's transcript step or model call, the workspace's API token used, or its egress
through the proxy; and, for a human attempt opened in JupyterHub, the hub's own record of its
server's activity (terminal input, kernel messages), as the monitor's evaluation job last read it
(`baseline.monitor.hub_activity`; the board itself never calls the hub). When that reading is
missing, stale or failed, the attempt's line says why (``hub_activity_unknown``) and its last
activity is Baseline's records alone.
"""

from __future__ import annotations

import functools
import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import and_, func, or_, select, true
from sqlalchemy.orm import Session

from baseline.attempts import clock, schedule
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    AgentRun,
    Alert,
    Attempt,
    AttemptStatus,
    AttemptToken,
    EgressEvent,
    GpuAssignment,
    Grading,
    Host,
    HubLoginToken,
    JobStatus,
    ModelCall,
    MonitorSettings,
    Participant,
    Pause,
    PauseReason,
    Reproduction,
    Snapshot,
    SnapshotKind,
    Study,
    Task,
    TranscriptEntry,
    User,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.monitor.hub_activity import HubActivity

# How many of the latest finished reproductions and gradings the failure rate is taken over.
FAILURE_WINDOW = 20
# Alerts cleared longer ago than this many are not listed (the open ones always are).
RECENT_CLEARED = 50


class PauseView(BaseModel):
    reason: str
    note: str
    started_at: datetime
    ended_at: datetime | None


class SnapshotView(BaseModel):
    id: int
    kind: str
    due_working_s: float
    working_s: float
    taken_at: datetime
    late: bool


class GradeView(BaseModel):
    id: int
    kind: str
    status: str
    score: float | None
    error: str | None


class MissingCheckpoint(BaseModel):
    """A checkpoint the clock has passed whose snapshot is not taken yet."""

    due_working_s: float
    overdue_working_s: float


class AttemptView(BaseModel):
    id: int
    participant: str
    pseudonym: str
    kind: str
    group: str
    task: str
    status: str
    # running, paused, not started, ended
    clock: str
    pause_reason: str | None
    time_scale: float
    working_s: float
    limit_s: float
    last_activity_at: datetime | None
    # A hub-using human attempt: its server's last activity as JupyterHub records it, or why
    # that is unknown now (then last_activity_at is Baseline's records alone).
    hub_activity_at: datetime | None = None
    hub_activity_unknown: str | None = None
    # Working seconds since the last activity while the clock ran (None when not running).
    idle_working_s: float | None
    last_snapshot: SnapshotView | None
    last_grade: GradeView | None
    missing_checkpoints: list[MissingCheckpoint]
    pauses: list[PauseView]
    cost_usd: float
    workspace: str | None
    workspace_status: str | None
    host: str | None


class HostView(BaseModel):
    id: int
    name: str
    enabled: bool
    healthy: bool
    last_checked_at: datetime | None
    last_error: str | None
    gpus_total: int
    gpus_free: int
    running_workspaces: int


class QueueView(BaseModel):
    reproductions_queued: int
    reproductions_running: int
    gradings_queued: int
    gradings_running: int
    oldest_queued_at: datetime | None
    oldest_age_s: float | None
    recent_reproductions: int
    failed_reproductions: int
    recent_gradings: int
    failed_gradings: int


class SpendView(BaseModel):
    judge_usd: float
    agent_usd: float
    total_usd: float
    budget_usd: float | None
    share: float | None


class AlertView(BaseModel):
    id: int
    rule: str
    subject: str
    message: str
    fired_at: datetime
    cleared_at: datetime | None
    acknowledged_at: datetime | None
    acknowledged_by: str | None


class Board(BaseModel):
    study_id: int
    study: str
    at: datetime
    attempts: list[AttemptView]
    hosts: list[HostView]
    queue: QueueView
    spend: SpendView
    alerts: list[AlertView]


# A hub-using attempt's activity before the evaluation job has read the hub in this home.
HUB_NOT_READ = (
    "JupyterHub's activity not read yet (the monitor's evaluation job reads it every 30 s)"
)

# The version names the wall time in buckets of this many seconds, so what only the passing of
# time changes (a checkpoint falling due, an idle participant) reaches a polling page within it.
VERSION_BUCKET_S = 30


def _markers(study_id: int) -> Any:
    """One query of one row whose values change whenever a row the board reads changes: per
    table its rows, and per column how many are set and the greatest (an id, a time), and how
    many rows hold each status (statuses change in place)."""
    in_study = select(Attempt.id).where(Attempt.study_id == study_id).scalar_subquery()
    snap_ids = select(Snapshot.id).where(Snapshot.attempt_id.in_(in_study)).scalar_subquery()
    ws_ids = select(Workspace.id).where(Workspace.attempt_id.in_(in_study)).scalar_subquery()
    tables: list[tuple[tuple[Any, ...], Any, Any]] = [
        (
            (Attempt.id, Attempt.started_at, Attempt.first_login_at, Attempt.ended_at),
            Attempt.status,
            Attempt.study_id == study_id,
        ),
        ((Pause.id, Pause.started_at, Pause.ended_at), None, Pause.attempt_id.in_(in_study)),
        ((Snapshot.id,), None, Snapshot.attempt_id.in_(in_study)),
        (
            (Reproduction.id, Reproduction.finished_at),
            Reproduction.status,
            Reproduction.snapshot_id.in_(snap_ids),
        ),
        (
            (Grading.id, Grading.finished_at, Grading.score),
            Grading.status,
            Grading.snapshot_id.in_(snap_ids),
        ),
        ((ModelCall.id,), None, ModelCall.study_id == study_id),
        ((Workspace.id,), Workspace.status, Workspace.attempt_id.in_(in_study)),
        ((EgressEvent.id,), None, EgressEvent.workspace_id.in_(ws_ids)),
        ((AttemptToken.last_used_at,), None, AttemptToken.attempt_id.in_(in_study)),
        ((AgentRun.steps,), None, AgentRun.attempt_id.in_(in_study)),
        ((Alert.id, Alert.cleared_at, Alert.acknowledged_at), None, Alert.study_id == study_id),
        ((GpuAssignment.id, GpuAssignment.released_at), None, true()),
        ((Host.id, Host.last_checked_at, Host.last_error), None, true()),
        ((Participant.id,), None, Participant.study_id == study_id),
        ((MonitorSettings.updated_at,), None, MonitorSettings.study_id == study_id),
    ]
    parts = []
    for columns, status, where in tables:
        values: list[Any] = [func.count()]
        values += [f(c) for c in columns for f in (func.count, func.max)]
        if status is not None:
            values += [func.count().filter(status == v) for v in status.type.enums]
        parts.append(select(*values).select_from(columns[0].table).where(where).subquery())
    extra = select(
        select(func.sum(Attempt.working_time_limit_s))
        .where(Attempt.study_id == study_id)
        .scalar_subquery(),
        select(func.count()).select_from(Host).where(Host.healthy.is_(True)).scalar_subquery(),
        select(func.count()).select_from(Host).where(Host.enabled.is_(True)).scalar_subquery(),
    ).subquery()
    parts.append(extra)
    joined: Any = parts[0]
    for part in parts[1:]:
        joined = joined.join(part, true())
    return select(*(c for part in parts for c in part.c)).select_from(joined)


def version(
    session: Session, study_id: int, now: datetime | None = None, hub: HubActivity | None = None
) -> str:
    """The board's version (its ETag) from one aggregate query, without building the board.

    It changes when any row the board shows is added or changes (counts, latest ids and times,
    status counts, the study's settings), and every `VERSION_BUCKET_S` of wall time; working and
    idle time in between are extrapolated by the page itself; a new reading of the hub's activity
    (`hub`) changes it too. A poll that finds the version it holds is answered 304 at the price
    of this one query."""
    now = now or utcnow()
    values = session.execute(_markers(study_id)).one()
    bucket = int(now.timestamp() // VERSION_BUCKET_S)
    read = None if hub is None else (hub.tried_at, hub.error)
    text = repr((study_id, bucket, read, *(str(v) for v in values)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class _Row:
    """One attempt's columns and its pauses and snapshots, read as plain rows: building 500
    attempts' ORM objects with their children took most of the board's time."""

    attempt: Any  # the attempt's selected columns
    participant: str
    pseudonym: str
    kind: str
    group: str
    task: str
    user_id: int | None
    pauses: list[Any] = field(default_factory=list)
    snapshots: list[Any] = field(default_factory=list)


def _rows(session: Session, study: Study) -> list[_Row]:
    people = {
        p.id: p
        for p in session.scalars(select(Participant).where(Participant.study_id == study.id))
    }
    slugs = dict(
        session.execute(
            select(Task.id, Task.slug).where(
                Task.id.in_(select(Attempt.task_id).where(Attempt.study_id == study.id))
            )
        ).all()
    )
    rows: dict[int, _Row] = {}
    for a in session.execute(
        select(
            Attempt.id,
            Attempt.participant_id,
            Attempt.task_id,
            Attempt.status,
            Attempt.started_at,
            Attempt.first_login_at,
            Attempt.ended_at,
            Attempt.time_scale,
            Attempt.working_time_limit_s,
        )
        .where(Attempt.study_id == study.id)
        .order_by(Attempt.id)
    ):
        person = people[a.participant_id]
        rows[a.id] = _Row(
            a,
            person.display_name,
            person.pseudonym,
            person.kind.value,
            person.group,
            slugs[a.task_id],
            person.user_id,
        )
    in_study = Attempt.study_id == study.id
    for pause in session.execute(
        select(Pause.attempt_id, Pause.started_at, Pause.ended_at, Pause.reason, Pause.note)
        .join(Attempt, Attempt.id == Pause.attempt_id)
        .where(in_study)
        .order_by(Pause.started_at, Pause.id)
    ):
        rows[pause.attempt_id].pauses.append(pause)
    for snap in session.execute(
        select(
            Snapshot.attempt_id,
            Snapshot.id,
            Snapshot.kind,
            Snapshot.due_working_s,
            Snapshot.taken_working_s,
            Snapshot.taken_at,
            Snapshot.late,
        )
        .join(Attempt, Attempt.id == Snapshot.attempt_id)
        .where(in_study)
        .order_by(Snapshot.taken_at, Snapshot.id)
    ):
        rows[snap.attempt_id].snapshots.append(snap)
    return list(rows.values())


def _latest(found: dict[int, datetime], key: int, at: datetime | None) -> None:
    if at is not None and (key not in found or at > found[key]):
        found[key] = at


def _activity(session: Session, study_id: int) -> dict[int, datetime]:
    """Each attempt's latest recorded sign of work besides its own rows (see the module doc)."""
    found: dict[int, datetime] = {}
    queries = [
        select(AgentRun.attempt_id, func.max(TranscriptEntry.ended_at))
        .join(TranscriptEntry, TranscriptEntry.run_id == AgentRun.id)
        .join(Attempt, Attempt.id == AgentRun.attempt_id)
        .where(Attempt.study_id == study_id)
        .group_by(AgentRun.attempt_id),
        select(ModelCall.attempt_id, func.max(ModelCall.created_at))
        .where(
            ModelCall.study_id == study_id,
            ModelCall.attempt_id.is_not(None),
            ModelCall.grading_id.is_(None),
        )
        .group_by(ModelCall.attempt_id),
        select(AttemptToken.attempt_id, func.max(AttemptToken.last_used_at))
        .join(Attempt, Attempt.id == AttemptToken.attempt_id)
        .where(Attempt.study_id == study_id)
        .group_by(AttemptToken.attempt_id),
        select(Workspace.attempt_id, func.max(EgressEvent.at))
        .join(Workspace, Workspace.id == EgressEvent.workspace_id)
        .join(Attempt, Attempt.id == Workspace.attempt_id)
        .where(Attempt.study_id == study_id)
        .group_by(Workspace.attempt_id),
    ]
    for query in queries:
        for attempt_id, at in session.execute(query):
            if attempt_id is not None:
                _latest(found, attempt_id, at)
    return found


def _hub_attempts(session: Session, study_id: int) -> set[int]:
    """The study's attempts their participant has opened in JupyterHub (not staff observing)."""
    return set(
        session.scalars(
            select(HubLoginToken.attempt_id)
            .join(Attempt, Attempt.id == HubLoginToken.attempt_id)
            .where(
                Attempt.study_id == study_id,
                HubLoginToken.used_at.is_not(None),
                HubLoginToken.observer.is_(False),
            )
            .distinct()
        )
    )


def _hub_seen(
    row: _Row, used: set[int], hub: HubActivity | None, now: datetime
) -> tuple[datetime | None, str | None]:
    """(the hub's last activity of the attempt's server, why it is unknown) for a live hub-using
    attempt; (None, None) for any other (an ended attempt's server is gone from the hub)."""
    live = row.attempt.status in LIVE_ATTEMPT_STATUSES
    if not live or row.attempt.id not in used or row.user_id is None:
        return None, None
    if hub is None:
        return None, HUB_NOT_READ
    unknown = hub.unknown(now)
    if unknown is not None:
        return None, unknown
    return hub.server_activity(row.user_id, row.attempt.id), None


def _own_activity(row: _Row) -> datetime | None:
    times = [row.attempt.started_at, row.attempt.first_login_at]
    times += [p.ended_at for p in row.pauses]
    present = [t for t in times if t is not None]
    return max(present) if present else None


def _grades(session: Session, study_id: int) -> dict[int, GradeView]:
    """Each attempt's latest grading (of any of its snapshots)."""
    latest = (
        select(func.max(Grading.id))
        .join(Snapshot, Snapshot.id == Grading.snapshot_id)
        .join(Attempt, Attempt.id == Snapshot.attempt_id)
        .where(Attempt.study_id == study_id)
        .group_by(Snapshot.attempt_id)
    )
    rows = session.execute(
        select(
            Snapshot.attempt_id,
            Grading.id,
            Grading.kind,
            Grading.status,
            Grading.score,
            Grading.error,
        )
        .join(Snapshot, Snapshot.id == Grading.snapshot_id)
        .where(Grading.id.in_(latest))
    )
    return {
        r.attempt_id: GradeView(
            id=r.id, kind=r.kind.value, status=r.status.value, score=r.score, error=r.error
        )
        for r in rows
    }


def _costs(session: Session, study_id: int) -> tuple[dict[int, float], float, float]:
    """(cost per attempt, judge total, agent total) from the ledger."""
    per_attempt: dict[int, float] = defaultdict(float)
    judge = agent = 0.0
    rows = session.execute(
        select(ModelCall.attempt_id, ModelCall.grading_id.is_(None), func.sum(ModelCall.cost_usd))
        .where(ModelCall.study_id == study_id)
        .group_by(ModelCall.attempt_id, ModelCall.grading_id.is_(None))
    )
    for attempt_id, is_agent, cost in rows:
        cost = float(cost or 0.0)
        if attempt_id is not None:
            per_attempt[attempt_id] += cost
        if is_agent:
            agent += cost
        else:
            judge += cost
    return per_attempt, judge, agent


def _workspaces(session: Session, study_id: int) -> dict[int, tuple[str, str, str | None]]:
    """Each attempt's latest attempt workspace that is not destroyed: (name, status, host)."""
    rows = session.execute(
        select(Workspace.attempt_id, Workspace.name, Workspace.status, Host.name)
        .join(Attempt, Attempt.id == Workspace.attempt_id)
        .outerjoin(Host, Host.id == Workspace.host_id)
        .where(
            Attempt.study_id == study_id,
            Workspace.purpose == WorkspacePurpose.ATTEMPT,
            Workspace.status != WorkspaceStatus.DESTROYED,
        )
        .order_by(Workspace.id)
    )
    return {
        attempt_id: (name, status.value, host)
        for attempt_id, name, status, host in rows
        if attempt_id is not None
    }


def missing_checkpoints(
    points: list[schedule.DuePoint], row: _Row, working_s: float, live: bool
) -> list[MissingCheckpoint]:
    """Checkpoints whose working time has passed but whose snapshot is not taken (the due
    points are the snapshot schedule's own, `baseline.attempts.schedule.due_points`)."""
    if not live or row.attempt.started_at is None:
        return []
    taken = {(s.kind, s.due_working_s) for s in row.snapshots}
    return [
        MissingCheckpoint.model_construct(
            due_working_s=point.due_working_s, overdue_working_s=working_s - point.due_working_s
        )
        for point in points
        if point.kind is SnapshotKind.CHECKPOINT
        and point.due_working_s < working_s
        and (point.kind, point.due_working_s) not in taken
    ]


def _attempt_view(
    row: _Row,
    now: datetime,
    activity: datetime | None,
    hub_seen: tuple[datetime | None, str | None],
    grading: GradeView | None,
    cost: float,
    workspace: tuple[str, str, str | None] | None,
    points: list[schedule.DuePoint],
) -> AttemptView:
    """One attempt's line, its clock worked out as `baseline.attempts.clock.state` does."""
    a = row.attempt
    live = a.status in LIVE_ATTEMPT_STATUSES
    at = now if live or a.ended_at is None else min(now, a.ended_at)
    intervals = [clock.Interval(p.started_at, p.ended_at, p.reason) for p in row.pauses]
    working = clock.working_s(a.started_at, intervals, at, a.time_scale)
    current = next((p for p in row.pauses if p.ended_at is None), None)
    waiting = current is not None and current.reason is PauseReason.NOT_STARTED
    if a.status is AttemptStatus.PENDING or (live and (a.started_at is None or waiting)):
        # as the participant's own bar says: waiting for the first login (or an agent's driver)
        # is not a pause anyone took
        word = "not started"
    elif not live:
        word = "ended"
    else:
        word = "paused" if current is not None else "running"
    own = _own_activity(row)
    last = max((t for t in (activity, own, hub_seen[0]) if t is not None), default=None)
    idle = None
    if word == "running" and last is not None:
        idle = max((now - last).total_seconds(), 0.0) * a.time_scale
    snapshot = row.snapshots[-1] if row.snapshots else None
    # Built from the database's own typed rows: constructed without validating each again.
    return AttemptView.model_construct(
        id=a.id,
        participant=row.participant,
        pseudonym=row.pseudonym,
        kind=row.kind,
        group=row.group,
        task=row.task,
        status=a.status.value,
        clock=word,
        pause_reason=current.reason.value if current is not None and live else None,
        time_scale=a.time_scale,
        working_s=working,
        limit_s=a.working_time_limit_s,
        last_activity_at=last,
        hub_activity_at=hub_seen[0],
        hub_activity_unknown=hub_seen[1],
        idle_working_s=idle,
        last_snapshot=None
        if snapshot is None
        else SnapshotView.model_construct(
            id=snapshot.id,
            kind=snapshot.kind.value,
            due_working_s=snapshot.due_working_s,
            working_s=snapshot.taken_working_s,
            taken_at=snapshot.taken_at,
            late=snapshot.late,
        ),
        last_grade=grading,
        missing_checkpoints=missing_checkpoints(points, row, working, live),
        pauses=[
            PauseView.model_construct(
                reason=p.reason.value, note=p.note, started_at=p.started_at, ended_at=p.ended_at
            )
            for p in row.pauses
        ],
        cost_usd=round(cost, 6),
        workspace=workspace[0] if workspace else None,
        workspace_status=workspace[1] if workspace else None,
        host=workspace[2] if workspace else None,
    )


def hosts(session: Session) -> list[HostView]:
    """Every host (hosts serve every study): health, free GPUs, running workspaces."""
    held = dict(
        session.execute(
            select(GpuAssignment.host_id, func.count())
            .where(GpuAssignment.released_at.is_(None))
            .group_by(GpuAssignment.host_id)
        ).all()
    )
    running = dict(
        session.execute(
            select(Workspace.host_id, func.count())
            .where(Workspace.status == WorkspaceStatus.RUNNING)
            .group_by(Workspace.host_id)
        ).all()
    )
    return [
        HostView(
            id=host.id,
            name=host.name,
            enabled=host.enabled,
            healthy=host.healthy,
            last_checked_at=host.last_checked_at,
            last_error=host.last_error,
            gpus_total=len(host.gpus or []),
            gpus_free=max(len(host.gpus or []) - held.get(host.id, 0), 0),
            running_workspaces=running.get(host.id, 0),
        )
        for host in session.scalars(select(Host).order_by(Host.name))
    ]


def _recent_failures(session: Session, study_id: int) -> tuple[int, int, int, int]:
    """(reproductions, of them failing, gradings, of them failing) among the latest finished.

    Failing: a reproduction that failed or whose run failed (a failure class or time-out); a
    grading that failed, or whose scoring reported an error (a script that crashed is scored at
    the floor, with the error kept)."""
    done = (JobStatus.SUCCEEDED, JobStatus.INCOMPLETE, JobStatus.FAILED)
    repro = session.execute(
        select(Reproduction.status, Reproduction.failure_class, Reproduction.timed_out)
        .join(Snapshot, Snapshot.id == Reproduction.snapshot_id)
        .join(Attempt, Attempt.id == Snapshot.attempt_id)
        .where(Attempt.study_id == study_id, Reproduction.status.in_(done))
        .order_by(Reproduction.finished_at.desc(), Reproduction.id.desc())
        .limit(FAILURE_WINDOW)
    ).all()
    failed_repro = sum(
        1
        for status, failure, timed_out in repro
        if status is JobStatus.FAILED or failure or timed_out
    )
    grades = session.execute(
        select(Grading.status, Grading.error)
        .join(Snapshot, Snapshot.id == Grading.snapshot_id)
        .join(Attempt, Attempt.id == Snapshot.attempt_id)
        .where(Attempt.study_id == study_id, Grading.status.in_(done))
        .order_by(Grading.finished_at.desc(), Grading.id.desc())
        .limit(FAILURE_WINDOW)
    ).all()
    failed_grades = sum(1 for status, error in grades if status is JobStatus.FAILED or error)
    return len(repro), failed_repro, len(grades), failed_grades


def _queue(session: Session, study_id: int, now: datetime) -> QueueView:
    in_study = and_(Snapshot.attempt_id == Attempt.id, Attempt.study_id == study_id)
    counts: dict[tuple[str, JobStatus], int] = {}
    for name, model in (("reproduction", Reproduction), ("grading", Grading)):
        for status, count in session.execute(
            select(model.status, func.count())
            .join(Snapshot, Snapshot.id == model.snapshot_id)
            .join(Attempt, in_study)
            .where(model.status.in_((JobStatus.QUEUED, JobStatus.RUNNING)))
            .group_by(model.status)
        ):
            counts[(name, status)] = count
    oldest_repro = session.scalar(
        select(func.min(Snapshot.taken_at))
        .join(Reproduction, Reproduction.snapshot_id == Snapshot.id)
        .join(Attempt, in_study)
        .where(Reproduction.status == JobStatus.QUEUED)
    )
    oldest_grading = session.scalar(
        select(func.min(Grading.created_at))
        .join(Snapshot, Snapshot.id == Grading.snapshot_id)
        .join(Attempt, in_study)
        .where(Grading.status == JobStatus.QUEUED)
    )
    oldest = min((t for t in (oldest_repro, oldest_grading) if t is not None), default=None)
    repro, failed_repro, grades, failed_grades = _recent_failures(session, study_id)
    return QueueView(
        reproductions_queued=counts.get(("reproduction", JobStatus.QUEUED), 0),
        reproductions_running=counts.get(("reproduction", JobStatus.RUNNING), 0),
        gradings_queued=counts.get(("grading", JobStatus.QUEUED), 0),
        gradings_running=counts.get(("grading", JobStatus.RUNNING), 0),
        oldest_queued_at=oldest,
        oldest_age_s=None if oldest is None else max((now - oldest).total_seconds(), 0.0),
        recent_reproductions=repro,
        failed_reproductions=failed_repro,
        recent_gradings=grades,
        failed_gradings=failed_grades,
    )


def _alerts(session: Session, study_id: int) -> list[AlertView]:
    """The open alerts, then the latest cleared ones; newest first within each."""
    rows = session.execute(
        select(Alert, User.name)
        .outerjoin(User, User.id == Alert.acknowledged_by_id)
        .where(Alert.study_id == study_id)
        .where(
            or_(
                Alert.cleared_at.is_(None),
                Alert.id.in_(
                    select(Alert.id)
                    .where(Alert.study_id == study_id, Alert.cleared_at.is_not(None))
                    .order_by(Alert.id.desc())
                    .limit(RECENT_CLEARED)
                ),
            )
        )
        .order_by(Alert.cleared_at.is_not(None), Alert.id.desc())
    )
    return [
        AlertView(
            id=alert.id,
            rule=alert.rule.value,
            subject=alert.subject,
            message=alert.message,
            fired_at=alert.fired_at,
            cleared_at=alert.cleared_at,
            acknowledged_at=alert.acknowledged_at,
            acknowledged_by=name,
        )
        for alert, name in rows
    ]


def study_board(
    session: Session, study: Study, now: datetime | None = None, hub: HubActivity | None = None
) -> Board:
    """Everything the monitor shows for one study at `now` (see the module doc); `hub` is the
    evaluation job's latest reading of JupyterHub (`baseline.monitor.hub_activity.load`)."""
    now = now or utcnow()
    rows = _rows(session, study)

    @functools.cache
    def points(limit_s: float) -> list[schedule.DuePoint]:
        hours = list(study.checkpoint_hours)
        return schedule.due_points(limit_s, hours, study.snapshot_interval_minutes)

    activity = _activity(session, study.id)
    hub_used = _hub_attempts(session, study.id)
    grades = _grades(session, study.id)
    per_attempt, judge, agent = _costs(session, study.id)
    spaces = _workspaces(session, study.id)
    settings = session.get(MonitorSettings, study.id)
    budget = settings.budget_usd if settings else None
    total = judge + agent
    return Board(
        study_id=study.id,
        study=study.name,
        at=now,
        attempts=[
            _attempt_view(
                r,
                now,
                activity.get(r.attempt.id),
                _hub_seen(r, hub_used, hub, now),
                grades.get(r.attempt.id),
                per_attempt.get(r.attempt.id, 0.0),
                spaces.get(r.attempt.id),
                points(r.attempt.working_time_limit_s),
            )
            for r in rows
        ],
        hosts=hosts(session),
        queue=_queue(session, study.id, now),
        spend=SpendView(
            judge_usd=round(judge, 6),
            agent_usd=round(agent, 6),
            total_usd=round(total, 6),
            budget_usd=budget,
            share=None if not budget else total / budget,
        ),
        alerts=_alerts(session, study.id),
    )


def board_json(board: Board) -> str:
    """The board as JSON text, safe to embed in an HTML ``<script type="application/json">``
    (no ``<`` left to close the element)."""
    return board.model_dump_json().replace("<", "\\u003c")
