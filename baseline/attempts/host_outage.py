"""A lost host: outage pauses while it does not answer, and moving an attempt off it.

The scheduler probes every enabled host that carries a live attempt workspace every
`PROBE_EVERY_S` (`infra.remote.check_host`: the Docker API and a host command, each bounded by
its timeout), so an outage is noticed within `PROBE_EVERY_S + PROBE_TIMEOUT_S`. The first failed
probe opens an `outage` pause on each running attempt of the host, starting at that probe's time;
the first probe that gets an answer again closes it at its own time. The pause therefore spans
the outage exactly as the probes observed it, and no working time is charged in between.

An attempt can leave a lost host: `move_attempt` places a new workspace on another healthy host
that can give the attempt's hardware profile, seeds its submission from the attempt's latest
snapshot, retires the old workspace (its container and volume stay on the lost host, never
deleted by this; reconcile removes only the container once the host answers) and ends the outage
pause. The old workspace is retired only while its row says what the move read: one that another
process wrote meanwhile (restarted once its host answered, destroyed when its attempt ended) makes
the move undo itself, its new workspace destroyed, so one attempt never has two live workspaces.
A study's `outage_move` setting says whether the probe does this by itself after `MOVE_AFTER_S`
of outage ("automatic") or leaves it to a coordinator ("manual"). What was written
after the latest snapshot stays on the old volume only: the interval capture (the study's
`snapshot_interval_minutes`) bounds that loss; every snapshot already taken is in the store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NoReturn

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from baseline import audit
from baseline.attempts import clock, snapshots
from baseline.context import Context
from baseline.db import rows_changed
from baseline.errors import Conflict, DomainError, InvalidInput, NotFound
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    Attempt,
    Host,
    Pause,
    PauseReason,
    Snapshot,
    Study,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.studies import studies
from baseline.workspaces import backends, egress_gateway, workspaces
from infra import remote
from infra.workspace import WorkspaceError

PROBE_EVERY_S = 30.0
PROBE_TIMEOUT_S = 20
MOVE_AFTER_S = 300.0
MOVE_POLICIES = ("manual", "automatic")

HealthCheck = Callable[[str], remote.HostHealth]
# How this module's outage pauses begin: a host answering again ends only these (a hub outage,
# `baseline.hub.hub_watch`, ends when the hub answers).
HOST_OUTAGE_NOTE = "host "


def is_host_outage(pause: Pause | None) -> bool:
    return (
        pause is not None
        and pause.reason is PauseReason.OUTAGE
        and pause.note.startswith(HOST_OUTAGE_NOTE)
    )


def _probe(url: str) -> remote.HostHealth:
    return remote.check_host(url, timeout_s=PROBE_TIMEOUT_S)


@dataclass
class ProbeReport:
    down: dict[str, str] = field(default_factory=dict)  # host -> error
    paused: list[int] = field(default_factory=list)  # attempt ids
    resumed: list[int] = field(default_factory=list)
    moved: dict[int, str] = field(default_factory=dict)  # attempt id -> new host
    errors: dict[int, str] = field(default_factory=dict)  # attempt id -> why not moved


def attempt_workspace(session: Session, attempt: Attempt) -> Workspace | None:
    """The attempt's current workspace: its newest attempt-purpose workspace."""
    return session.scalar(
        select(Workspace)
        .where(Workspace.attempt_id == attempt.id, Workspace.purpose == WorkspacePurpose.ATTEMPT)
        .order_by(Workspace.id.desc())
        .limit(1)
    )


def attempts_on(session: Session, host: Host) -> list[Attempt]:
    """Live, started attempts whose current workspace is on `host`."""
    found: list[Attempt] = []
    for workspace in workspaces.live_workspaces(session, host):
        if workspace.purpose is not WorkspacePurpose.ATTEMPT or workspace.attempt_id is None:
            continue
        attempt = session.get(Attempt, workspace.attempt_id)
        if attempt is None or attempt.status not in LIVE_ATTEMPT_STATUSES:
            continue
        current = attempt_workspace(session, attempt)
        if current is not None and current.id == workspace.id:
            found.append(attempt)
    return found


def probe_hosts(
    ctx: Context,
    session: Session,
    *,
    check: HealthCheck = _probe,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
    move_after_s: float = MOVE_AFTER_S,
) -> ProbeReport:
    """One round: probe each host with live attempts, open or close outage pauses, and move
    the attempts of studies that move automatically once their outage is old enough."""
    report = ProbeReport()
    hosts = session.scalars(select(Host).where(Host.enabled.is_(True)).order_by(Host.name))
    for host in list(hosts):
        attempts = attempts_on(session, host)
        if not attempts:
            continue
        health = check(host.docker_url)
        host.last_checked_at = health.checked_at
        if not health.healthy:
            host.healthy = False
            host.last_error = f"outage: {health.error}"
            report.down[host.name] = health.error or "no answer"
            for attempt in attempts:
                if clock.open_pause(attempt) is None:
                    clock.start_pause(
                        session,
                        attempt,
                        PauseReason.OUTAGE,
                        None,
                        note=f"{HOST_OUTAGE_NOTE}{host.name} not answering: {health.error}",
                        at=health.checked_at,
                    )
                    report.paused.append(attempt.id)
            _move_automatically(ctx, session, attempts, report, backend_factory, move_after_s)
            continue
        was_down = not host.healthy
        for attempt in attempts:
            if is_host_outage(clock.open_pause(attempt)):
                clock.end_pause(session, attempt, None, at=health.checked_at)
                report.resumed.append(attempt.id)
        if was_down:  # back: the full check (GPUs, isolation) decides whether it takes work
            workspaces.check_host(session, host)
    session.flush()
    return report


def _move_automatically(
    ctx: Context,
    session: Session,
    attempts: list[Attempt],
    report: ProbeReport,
    backend_factory: workspaces.BackendFactory,
    move_after_s: float,
) -> None:
    now = utcnow()
    for attempt in attempts:
        study = session.get(Study, attempt.study_id)
        current = clock.open_pause(attempt)
        if study is None or study.outage_move != "automatic" or current is None:
            continue
        if current.reason is not PauseReason.OUTAGE:
            continue
        if now - current.started_at < timedelta(seconds=move_after_s):
            continue
        try:
            moved = move_attempt(ctx, session, attempt, backend_factory=backend_factory)
        except DomainError as exc:
            report.errors[attempt.id] = str(exc)  # stays paused; tried again next round
            continue
        host = session.get(Host, moved.host_id) if moved.host_id else None
        report.moved[attempt.id] = host.name if host is not None else "?"


def probe_job(ctx: Context) -> ProbeReport:
    """The scheduler's periodic entry point: one probe round in its own transaction."""
    with ctx.session() as session:
        return probe_hosts(ctx, session)


def latest_snapshot(session: Session, attempt: Attempt) -> Snapshot | None:
    return session.scalar(
        select(Snapshot)
        .where(Snapshot.attempt_id == attempt.id)
        .order_by(Snapshot.taken_at.desc(), Snapshot.id.desc())
        .limit(1)
    )


def move_attempt(
    ctx: Context,
    session: Session,
    attempt: Attempt,
    *,
    to_host: Host | None = None,
    actor_id: int | None = None,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
    at: datetime | None = None,
) -> Workspace:
    """Put the attempt on another host with its hardware profile, from its latest snapshot."""
    if attempt.status not in LIVE_ATTEMPT_STATUSES:
        raise Conflict(f"attempt {attempt.id} is {attempt.status.value}: nothing to move")
    old = attempt_workspace(session, attempt)
    if old is None or old.host_id is None or old.status not in workspaces.LIVE:
        raise Conflict(f"attempt {attempt.id} has no live workspace to move")
    seen = old.status  # what the old workspace is retired from, should no one write it meanwhile
    snapshot = latest_snapshot(session, attempt)
    if snapshot is None:
        raise Conflict(f"attempt {attempt.id} has no snapshot yet: nothing to restore elsewhere")
    if to_host is not None and to_host.id == old.host_id:
        raise InvalidInput(f"attempt {attempt.id} is on {to_host.name} already")
    others = [
        host
        for host in workspaces.list_hosts(session)
        if host.id != old.host_id and (to_host is None or host.id == to_host.id)
    ]
    name = workspaces.new_workspace_name(WorkspacePurpose.ATTEMPT, attempt)
    new = Workspace(
        attempt_id=attempt.id,
        purpose=WorkspacePurpose.ATTEMPT,
        backend=old.backend,
        name=name,
        image=old.image,
        hardware_profile=old.hardware_profile,
        task_dir=old.task_dir,
        status=WorkspaceStatus.PENDING,
    )
    session.add(new)
    session.flush()
    router = egress_gateway.router(ctx)  # the new host's gateway, if the study is proxied
    try:
        placed = workspaces.place(session, new, backend_factory, hosts=others, router=router)
    except egress_gateway.EgressUnavailable:
        placed = False  # why is the workspace's last_error; it must not stay PENDING
    if not placed:
        why = new.last_error or f"no healthy host can give profile {new.hardware_profile} now"
        session.delete(new)
        session.flush()
        raise Conflict(f"attempt {attempt.id} cannot move: {why}")
    store = snapshots.store_for(ctx)
    host = session.get(Host, new.host_id) if new.host_id else None
    assert host is not None  # placed
    with backends.open_backend(backend_factory, host) as backend:
        try:
            with snapshots.snapshot_tar(session, store, snapshot.id) as archive:
                backend.put_archive(workspaces.handle_of(new), "/home", archive)
        except WorkspaceError as exc:
            workspaces.destroy(session, new, backend_factory)
            why = f"attempt {attempt.id}: restoring snapshot {snapshot.id} failed: {exc}"
            raise Conflict(why) from exc
    if not _hold_live(session, attempt):
        _undo(session, attempt, new, backend_factory, "it ended while it was moving")
    # The old container and volume stay on the lost host; only its claim on the GPUs ends.
    why = f"moved to {host.name} (volume {old.submission_volume} left in place)"
    if not workspaces.retire(session, old, seen, why):
        became = f"its workspace {old.name} became {old.status.value} while it was moving"
        _undo(session, attempt, new, backend_factory, f"{became} (it was {seen.value})")
    current = clock.open_pause(attempt)
    if current is not None and current.reason is PauseReason.OUTAGE:
        clock.end_pause(session, attempt, actor_id, at=at)
    audit.record(
        session,
        "attempt.move",
        "attempt",
        attempt.id,
        actor_id,
        from_workspace=old.name,
        to_workspace=new.name,
        host=host.name,
        snapshot=snapshot.id,
    )
    session.flush()
    return new


def _hold_live(session: Session, attempt: Attempt) -> bool:
    """Whether the attempt is still live in the database, its row held until the move's
    transaction ends (a conditional UPDATE that changes nothing): an attempt that ends while
    the move runs either ended before this (False) or ends after the move, and its end then
    finds the new workspace. The end stops or freezes only a workspace that answers, so an
    attempt ended meanwhile left its old, lost workspace dead: the move retired it and the new
    one ran on for an ended attempt, holding its GPUs."""
    held = session.execute(
        update(Attempt)
        .where(Attempt.id == attempt.id, Attempt.status.in_(LIVE_ATTEMPT_STATUSES))
        .values(status=Attempt.status)
        .execution_options(synchronize_session=False)
    )
    session.refresh(attempt)
    return rows_changed(held) == 1


def _undo(
    session: Session,
    attempt: Attempt,
    new: Workspace,
    backend_factory: workspaces.BackendFactory,
    why: str,
) -> NoReturn:
    """A move that lost to another process writing the attempt or its old workspace since the
    move read them (reconcile restarted the old one once its host answered; the attempt ended;
    another move retired it): that process knew more recently what they are. The new workspace
    is destroyed, volume and all (what was restored there is the snapshot, still in the store),
    so that one attempt never has two live workspaces, nor a live one once ended; the outage
    pause stays open, and the next probe round or a coordinator decides again."""
    workspaces.destroy(session, new, backend_factory)
    raise Conflict(
        f"attempt {attempt.id} not moved: {why}; the new workspace {new.name} is destroyed"
    )


def move(
    ctx: Context,
    attempt_id: int,
    to_host: str | None,
    actor_id: int | None,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
) -> tuple[Workspace, str]:
    """The coordinator's action (CLI, portal): move one attempt; returns the workspace and host.

    A move refused after it made its new workspace (the restore failed, it lost a race) keeps
    what it did on record, the new workspace destroyed and its audit entries: its refusal
    rolled them back, though the container had been made and removed on the engine."""
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None:
            raise NotFound(f"no attempt {attempt_id}")
        host = workspaces.get_host(session, to_host) if to_host else None
        try:
            workspace = move_attempt(
                ctx,
                session,
                attempt,
                to_host=host,
                actor_id=actor_id,
                backend_factory=backend_factory,
            )
        except Conflict:
            session.commit()
            raise
        placed = session.get(Host, workspace.host_id) if workspace.host_id else None
        return workspace, placed.name if placed is not None else "?"


def set_move_policy(ctx: Context, study_ref: str, policy: str, actor_id: int | None) -> None:
    """Set the study's (named, or numbered by its id) outage move policy."""
    if policy not in MOVE_POLICIES:
        raise InvalidInput(f"outage move policy must be one of {', '.join(MOVE_POLICIES)}")
    with ctx.session() as session:
        study = studies.find_study(session, study_ref)
        study.outage_move = policy
        audit.record(session, "study.outage_move", "study", study.id, actor_id, policy=policy)
