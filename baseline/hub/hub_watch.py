"""The clock follows what the human can do: outage pauses while the hub is down, idle pauses.

A periodic job (`watch_job`, from the scheduler) looks at every live human attempt whose
participant has logged into the hub at least once (so studies that do not use the hub are never
touched) and:

- **Hub outage.** When the hub does not answer its health check, the participant cannot reach
  their workspace: each such attempt without an open pause gets an ``outage`` pause whose note
  starts with `HUB_OUTAGE_NOTE`, closed by the first round that finds the hub answering again.
  (Host outages, `baseline.attempts.host_outage`, close only their own outage pauses.)
- **Idle auto-pause** (the study's ``idle_pause_minutes``; off when unset). Idleness is decided
  from what runs in the workspace, not from the hub's ``last_activity`` (which lags and misses
  busy but silent kernels): the workspace is active while a kernel is busy or a process of the
  workspace user runs that is not the single-user server's baseline (the server itself, its
  kernels and terminal shells, the container's own init and main process); otherwise it is idle
  since the server's last activity (API call, kernel message, terminal input). After the idle
  minutes (working minutes: the attempt's time scale applies, like every other limit) an
  ``idle`` pause opens now, never retroactively, so snapshots already taken keep their working
  times. The next activity ends it, at that activity's time; so does the next "Open workspace".

Nothing here kills anything: a training job that runs for hours counts as activity, and the
hub is configured without a culler (see `infra.hub.config`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.attempts import clock, clock_listener
from baseline.context import Context
from baseline.hub_settings import hub_config
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    Attempt,
    Host,
    HubLoginToken,
    ParticipantKind,
    Pause,
    PauseReason,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.workspaces import backends, workspaces
from infra.hub import hub_api
from infra.hub.config import HubConfig
from infra.hub.names import hub_username, server_name
from infra.workspace import PARTICIPANT_USER, WorkspaceError

log = logging.getLogger(__name__)

HUB_OUTAGE_NOTE = "JupyterHub not answering"
PROCESS_LIST = ["ps", "-u", PARTICIPANT_USER, "-o", "pid=,ppid=,args="]


@dataclass(frozen=True)
class Activity:
    """What one look at an attempt's workspace found."""

    last_activity: datetime | None  # the server's (or, with no server, the hub's) record
    busy_kernels: int
    work_processes: tuple[str, ...]  # command lines of the participant's own running work

    @property
    def busy(self) -> bool:
        return self.busy_kernels > 0 or bool(self.work_processes)


@dataclass
class WatchReport:
    hub_up: bool = True
    outage_paused: list[int] = field(default_factory=list)
    outage_resumed: list[int] = field(default_factory=list)
    idle_paused: list[int] = field(default_factory=list)
    idle_resumed: list[int] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)


def work_processes(ps_output: str) -> tuple[str, ...]:
    """The participant's own work among the workspace user's processes (``pid ppid args``).

    Not work: the container's init (pid 1) and its main process (the first child of init), the
    single-user server, and its direct children (kernels, terminal shells, language servers):
    their presence is the idle baseline, and a kernel's business is read from the server.
    What the participant starts from a terminal or a kernel, or leaves running in the
    background, is a grandchild of the server or an orphan of init, and counts.
    """
    rows: list[tuple[int, int, str]] = []
    for line in ps_output.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            rows.append((int(parts[0]), int(parts[1]), parts[2]))
    servers = {pid for pid, _, args in rows if "jupyterhub-singleuser" in args}
    init_children = [pid for pid, ppid, _ in rows if ppid == 1 and pid not in servers]
    baseline = {1, *servers, *init_children[:1]}
    baseline |= {pid for pid, ppid, _ in rows if ppid in servers}
    found = [args for pid, _, args in rows if pid not in baseline and not args.startswith("ps ")]
    return tuple(found)


Observer = Callable[[Session, Attempt, Workspace], Activity]


def observe(
    config: HubConfig, session: Session, attempt: Attempt, workspace: Workspace
) -> Activity:
    """Look at the workspace: its processes (as root, through its backend) and its server."""
    host = session.get(Host, workspace.host_id) if workspace.host_id is not None else None
    user_id = attempt.participant.user_id
    if host is None or user_id is None:
        raise WorkspaceError(f"workspace {workspace.name} has no host or no participant account")
    with backends.open_backend(workspaces.backend_for_host, host) as backend:
        done = backend.exec(
            workspaces.handle_of(workspace), PROCESS_LIST, user="root", timeout_s=20
        )
    if done.exit_code not in (0, 1):  # 1: no process of that user at all
        raise WorkspaceError(f"listing processes in {workspace.name} failed ({done.exit_code})")
    server = hub_api.server_activity(
        config.public_url,
        config.service_token(),
        hub_username(user_id),
        server_name(attempt.id),
    )
    return Activity(
        last_activity=server.last_activity,
        busy_kernels=server.busy_kernels,
        work_processes=work_processes(done.output.decode(errors="replace")),
    )


def _hub_attempts(session: Session) -> list[tuple[Attempt, Workspace]]:
    """Live, started human attempts that have been opened in the hub, with a running workspace."""
    logged_in = select(HubLoginToken.attempt_id).where(HubLoginToken.used_at.is_not(None))
    rows = session.scalars(
        select(Attempt)
        .where(
            Attempt.id.in_(logged_in),
            Attempt.status.in_(LIVE_ATTEMPT_STATUSES),
            Attempt.first_login_at.is_not(None),
        )
        .order_by(Attempt.id)
    )
    found = []
    for attempt in rows:
        if attempt.participant.kind is not ParticipantKind.HUMAN:
            continue
        workspace = session.scalar(
            select(Workspace).where(
                Workspace.attempt_id == attempt.id,
                Workspace.purpose == WorkspacePurpose.ATTEMPT,
                Workspace.status == WorkspaceStatus.RUNNING,
            )
        )
        if workspace is not None:
            found.append((attempt, workspace))
    return found


def is_hub_outage(pause: Pause | None) -> bool:
    return (
        pause is not None
        and pause.reason is PauseReason.OUTAGE
        and pause.note.startswith(HUB_OUTAGE_NOTE)
    )


def _last_resume(attempt: Attempt) -> datetime | None:
    ends = [p.ended_at for p in attempt.pauses if p.ended_at is not None]
    return max(ends) if ends else None


def _idle_round(
    session: Session, attempt: Attempt, activity: Activity, now: datetime, report: WatchReport
) -> None:
    minutes = attempt.study.idle_pause_minutes
    current = clock.open_pause(attempt)
    if current is not None and current.reason is PauseReason.IDLE:
        seen = activity.last_activity
        if activity.busy or (seen is not None and seen > current.started_at):
            at = now if seen is None or seen <= current.started_at else min(seen, now)
            clock.end_pause(session, attempt, None, at=at)
            report.idle_resumed.append(attempt.id)
        return
    if current is not None or minutes is None or activity.busy:
        return
    known = [
        t for t in (activity.last_activity, _last_resume(attempt), attempt.first_login_at) if t
    ]
    idle_since = max(known) if known else now
    threshold = timedelta(seconds=minutes * 60.0 / attempt.time_scale)
    if now - idle_since >= threshold:
        clock.start_pause(
            session,
            attempt,
            PauseReason.IDLE,
            None,
            note=f"no activity in the workspace since {idle_since.isoformat(timespec='seconds')}",
            at=now,
        )
        report.idle_paused.append(attempt.id)


def watch(
    session: Session,
    config: HubConfig,
    *,
    observer: Observer | None = None,
    now: datetime | None = None,
) -> WatchReport:
    """One round over every hub-using attempt: outage pauses, then idle pauses."""
    report = WatchReport()
    targets = _hub_attempts(session)
    if not targets:
        return report
    look = observer or partial(observe, config)
    public_url = config.public_url
    report.hub_up = hub_api.hub_is_up(public_url)
    at = now or utcnow()
    for attempt, workspace in targets:
        current = clock.open_pause(attempt)
        if not report.hub_up:
            if current is None:
                clock.start_pause(
                    session,
                    attempt,
                    PauseReason.OUTAGE,
                    None,
                    note=f"{HUB_OUTAGE_NOTE} at {public_url}: the workspace cannot be reached",
                    at=at,
                )
                report.outage_paused.append(attempt.id)
            continue
        if is_hub_outage(current):
            clock.end_pause(session, attempt, None, at=at)
            report.outage_resumed.append(attempt.id)
        if attempt.study.idle_pause_minutes is None and not (
            current is not None and current.reason is PauseReason.IDLE
        ):
            continue
        try:
            activity = look(session, attempt, workspace)
        except (WorkspaceError, hub_api.HubUnreachable) as exc:
            report.errors[attempt.id] = str(exc)  # not known to be idle: nothing changes
            continue
        _idle_round(session, attempt, activity, at, report)
    session.flush()
    return report


def watch_job(ctx: Context) -> WatchReport:
    """The scheduler's periodic entry point: one round in its own transaction."""
    with ctx.session() as session:
        report = watch(session, hub_config(ctx.settings))
        changed = (
            report.outage_paused + report.outage_resumed + report.idle_paused + report.idle_resumed
        )
    for attempt_id in changed:
        clock_listener.clock_changed(attempt_id)
    if report.errors:
        log.warning("hub watch could not look at attempts: %s", report.errors)
    return report
