"""Workspaces in the domain: hosts, placement, life cycle and reconciliation.

Placement picks an enabled, healthy host that can give the profile's GPUs right now (exclusive
assignment is `baseline.workspaces.gpu_allocation`'s), records a `Workspace` row and creates and
starts the container through the host's backend. When no host has room, the workspace stays PENDING
(and so does its attempt), visibly, and `reconcile` places it later. Reconcile also removes
containers no live workspace owns, and restarts workspaces whose container died (engine restart,
host reboot) on the same submission volume, so the participant's files come back with them.

Backends are made per host by a factory (`backend_for_host` by default) so that tests can label
what they create and callers can inject another backend kind.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session, object_session

from baseline import audit
from baseline.context import Context
from baseline.db import commit_step, rows_changed
from baseline.errors import Conflict, DomainError, InvalidInput, NotFound
from baseline.models import (
    Attempt,
    AttemptStatus,
    Host,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.tasks import submission_seed
from baseline.workspaces import (
    attempt_tokens,
    egress_gateway,
    gpu_allocation,
    network_isolation,
    terminal_records,
)
from baseline.workspaces.backends import (
    BackendFactory,
    PlacementError,
    backend_for_host,
    deployment,
    handle_of,
    open_backend,
)
from infra import remote
from infra.docker_backend import DockerBackend
from infra.hardware import ProfileConfigError, get_profile
from infra.workspace import (
    ORPHAN_MIN_AGE_S,
    HardwareProfile,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceHandle,
    WorkspaceSpec,
    WorkspaceState,
)

log = logging.getLogger(__name__)

LIVE = (
    WorkspaceStatus.CREATING,
    WorkspaceStatus.RUNNING,
    WorkspaceStatus.STOPPED,
    WorkspaceStatus.DEAD,
)
# Made, used and destroyed by one job in one go (`baseline.grading.reproductions`'s
# `disposable_workspace`, `family_environment`'s scoring GPUs): its job owns it, and reconcile
# neither marks it dead nor restarts it; nobody would use it restarted. Who destroys it: its job
# when it ends; recovery when its runner died (`grading.claims.remove_workspace`); and the
# gradings' recovery job, every one no job holds any more (`grading.claims.sweep_disposable`:
# a destroy that failed when its job ended, a runner that died before naming it).
DISPOSABLE = frozenset({WorkspacePurpose.REPRODUCTION, WorkspacePurpose.SCORING})


# -- hosts ---------------------------------------------------------------------------------


def add_host(
    session: Session,
    name: str,
    docker_url: str,
    actor_id: int | None,
    declared_gpus: list[dict[str, object]] | None = None,
) -> Host:
    if not name.strip():
        raise InvalidInput("a host needs a name")
    if not docker_url.startswith(("unix://", "ssh://")):
        raise InvalidInput(f"host URL {docker_url!r} must start with unix:// or ssh://")
    if session.scalar(select(Host).where(Host.name == name)) is not None:
        raise Conflict(f"a host named {name} exists already")
    host = Host(
        name=name,
        docker_url=docker_url,
        gpus=declared_gpus or [],
        gpus_declared=bool(declared_gpus),
    )
    if declared_gpus:
        gpu_allocation.inventory(host)  # validates the declaration
    session.add(host)
    session.flush()
    audit.record(session, "host.add", "host", host.id, actor_id, url=docker_url)
    return host


def list_hosts(session: Session) -> list[Host]:
    return list(session.scalars(select(Host).order_by(Host.name)))


def get_host(session: Session, name: str) -> Host:
    host = session.scalar(select(Host).where(Host.name == name))
    if host is None:
        raise NotFound(f"no host named {name}")
    return host


def check_host(session: Session, host: Host) -> remote.HostHealth:
    """Probe both channels, refresh the GPU inventory, make sure workspaces on the host cannot
    reach each other (`baseline.workspaces.network_isolation`), record the outcome on the host.

    The isolation check's notes (networks created or migrated) are in `details["networks"]`.
    """
    health = remote.check_host(host.docker_url)
    host.last_checked_at = health.checked_at
    host.healthy = health.healthy
    host.last_error = health.error
    if health.healthy:
        try:
            runner = remote.runner_for_url(host.docker_url)
            gpu_allocation.refresh_inventory(session, host, runner)
        except (DomainError, remote.RemoteError) as exc:
            host.healthy = False
            host.last_error = str(exc)
    if host.healthy:
        isolation = network_isolation.check(host.docker_url)
        health.details["networks"] = isolation.notes
        if isolation.problems:
            host.healthy = False
            host.last_error = "; ".join(isolation.problems)
    session.flush()
    return health


def live_workspaces(session: Session, host: Host | None = None) -> list[Workspace]:
    query = select(Workspace).where(Workspace.status.in_(LIVE)).order_by(Workspace.name)
    if host is not None:
        query = query.where(Workspace.host_id == host.id)
    return list(session.scalars(query))


# -- placement and life cycle --------------------------------------------------------------


def running_attempt_workspace(session: Session, attempt_id: int) -> Workspace | None:
    """The attempt's workspace that runs now (its own, not a reproduction's), if any."""
    return session.scalar(
        select(Workspace).where(
            Workspace.attempt_id == attempt_id,
            Workspace.purpose == WorkspacePurpose.ATTEMPT,
            Workspace.status == WorkspaceStatus.RUNNING,
        )
    )


def _profile(name: str) -> HardwareProfile:
    try:
        return get_profile(name)[0]
    except ProfileConfigError as exc:
        raise InvalidInput(str(exc)) from exc


def _spec(session: Session, workspace: Workspace) -> WorkspaceSpec:
    labels = {"baseline.purpose": workspace.purpose.value}
    if workspace.attempt_id is not None:
        labels["baseline.attempt"] = str(workspace.attempt_id)
    assignments = gpu_allocation.live_assignments(session, workspace)
    return WorkspaceSpec(
        name=workspace.name,
        # A restart uses the pinned image the workspace was first made from.
        image=workspace.image_digest or workspace.image,
        profile=_profile(workspace.hardware_profile),
        labels=labels,
        task_dir=Path(workspace.task_dir) if workspace.task_dir else None,
        network=workspace.network,
        gpu_device_ids=gpu_allocation.device_ids_of(assignments),
        submission_volume=workspace.submission_volume,
        env=dict(workspace.env or {}),
    )


def new_workspace_name(purpose: WorkspacePurpose, attempt: Attempt | None = None) -> str:
    """A fresh workspace name (known before the row, e.g. to register it with the proxy)."""
    prefix = f"ws-a{attempt.id}" if attempt is not None else f"ws-{purpose.value}"
    return f"{prefix}-{secrets.token_hex(4)}"


def request_workspace(
    session: Session,
    *,
    image: str,
    hardware_profile: str,
    purpose: WorkspacePurpose = WorkspacePurpose.ATTEMPT,
    attempt: Attempt | None = None,
    task_dir: Path | None = None,
    network: str = "none",
    env: dict[str, str] | None = None,
    name: str | None = None,
    actor_id: int | None = None,
    backend_factory: BackendFactory = backend_for_host,
    router: egress_gateway.Router | None = None,
) -> Workspace:
    """Record a workspace and place it now if a host has room; otherwise leave it PENDING.

    `router` gives the network and env of the host it lands on (its egress gateway), replacing
    `network` and `env`; a workspace left PENDING gets them when reconcile places it."""
    _profile(hardware_profile)
    workspace = Workspace(
        attempt_id=attempt.id if attempt is not None else None,
        purpose=purpose,
        backend=DockerBackend.name,
        name=name or new_workspace_name(purpose, attempt),
        image=image,
        hardware_profile=hardware_profile,
        network=network,
        env=env or None,
        task_dir=str(task_dir) if task_dir is not None else None,
        status=WorkspaceStatus.PENDING,
    )
    session.add(workspace)
    session.flush()
    audit.record(
        session,
        "workspace.request",
        "workspace",
        workspace.id,
        actor_id,
        attempt=workspace.attempt_id,
        profile=hardware_profile,
    )
    place(session, workspace, backend_factory, router=router)
    return workspace


def has_room_for(session: Session, hardware_profile: str) -> bool:
    """Whether some enabled, healthy host has the profile's GPUs free now, read only. A job that
    needs a workspace of its own (a reproduction) asks first: each try, one a minute for as long
    as the GPUs stay taken, named a workspace on the job's row, recorded it, found no room and
    rolled it back, five writes and the database's write lock for nothing."""
    return _room_on(session, _candidate_hosts(session), _profile(hardware_profile))


def _room_on(session: Session, hosts: list[Host], profile: HardwareProfile) -> bool:
    return any(
        gpu_allocation.has_room(session, host, profile.gpu_count, profile.gpu_model)
        for host in hosts
    )


def _candidate_hosts(session: Session) -> list[Host]:
    return list(
        session.scalars(
            select(Host).where(Host.enabled.is_(True), Host.healthy.is_(True)).order_by(Host.name)
        )
    )


def place(
    session: Session,
    workspace: Workspace,
    backend_factory: BackendFactory,
    hosts: list[Host] | None = None,
    router: egress_gateway.Router | None = None,
) -> bool:
    """Try to put a PENDING workspace on a host (one of `hosts` when given, each of them
    enabled and healthy), routed by `router` on that host; True once it is running.

    Only while its row still says PENDING (`_transition` to CREATING, which holds the row until
    the transaction ends, the container's creation included): the status was written whatever
    the row said, so a reconcile placing a workspace that another process stopped or destroyed
    since reconcile read it wrote it live again and made its container (an orphan, or a stopped
    workspace running on its GPUs), and two reconciles placing one workspace made two
    containers. A placement that finds the row no longer PENDING does nothing (no GPU, no
    container) and returns False; the workspace shows what its row says now.

    A host whose egress proxy cannot be had (`EgressUnavailable`) stops the placement with that
    reason rather than leaving the workspace silently without the network its study needs."""
    profile = _profile(workspace.hardware_profile)
    candidates = _candidate_hosts(session)
    if hosts is not None:
        allowed = {host.id for host in hosts}
        candidates = [host for host in candidates if host.id in allowed]
    if not _room_on(session, candidates, profile):
        return False  # no room now: left pending, its row not written (reconcile asks again)
    if not _transition(session, workspace, WorkspaceStatus.PENDING, WorkspaceStatus.CREATING):
        return False  # placed, stopped or destroyed by another process since it was read
    attempt = session.get(Attempt, workspace.attempt_id) if workspace.attempt_id else None
    for host in candidates:
        try:
            got = gpu_allocation.allocate(
                session, host, workspace, profile.gpu_count, profile.gpu_model
            )
        except InvalidInput:
            continue  # this host can never serve the profile
        if got is None:
            continue
        workspace.host_id = host.id
        workspace.status = WorkspaceStatus.CREATING
        session.flush()
        try:
            route = router(session, workspace, host) if router is not None else None
            if route is not None:
                workspace.network, workspace.env = route.network, route.env or None
            _create_and_start(session, workspace, host, backend_factory)
        except (WorkspaceError, PlacementError, egress_gateway.EgressUnavailable) as exc:
            gpu_allocation.release(session, workspace)
            egress_gateway.after_destroy(workspace, host)  # no container uses its credentials
            workspace.host_id = None
            workspace.status = WorkspaceStatus.PENDING
            workspace.last_error = f"{host.name}: {exc}"
            session.flush()
            log.warning("workspace %s not placed on %s: %s", workspace.name, host.name, exc)
            if isinstance(exc, egress_gateway.EgressUnavailable):
                raise
            continue
        if attempt is not None:
            attempt.image_digest = workspace.image_digest
            if attempt.status is AttemptStatus.PENDING:
                attempt.status = AttemptStatus.READY
        audit.record(
            session,
            "workspace.place",
            "workspace",
            workspace.id,
            None,
            host=host.name,
            image_digest=workspace.image_digest,
        )
        session.flush()
        return True
    workspace.status = WorkspaceStatus.PENDING  # reconcile tries again
    if attempt is not None and attempt.status is AttemptStatus.READY:
        attempt.status = AttemptStatus.PENDING
    session.flush()
    return False


def _create_and_start(
    session: Session, workspace: Workspace, host: Host, backend_factory: BackendFactory
) -> None:
    with open_backend(backend_factory, host) as backend:
        handle = backend.create(_spec(session, workspace))
        workspace.container_id = handle.container_id
        workspace.image_digest = handle.image_digest
        workspace.submission_volume = handle.submission_volume
        try:
            backend.start(handle)
            _after_create(workspace, host, backend, handle)
            submission_seed.seed_submission(session, workspace, backend, handle)
        except (WorkspaceError, PlacementError):
            backend.destroy(handle, keep_submission=workspace.submission_volume is not None)
            raise
    workspace.status = WorkspaceStatus.RUNNING
    workspace.last_error = None


def _after_create(
    workspace: Workspace, host: Host, backend: WorkspaceBackend, handle: WorkspaceHandle
) -> None:
    """What a new container needs once it runs: the egress proxy's CA when it uses the proxy,
    and an attempt's container its `task` credentials (`baseline.workspaces.attempt_tokens`) and its
    terminal recording (`baseline.workspaces.terminal_records`)."""
    try:
        egress_gateway.after_create(workspace, host, backend, handle)
        session = object_session(workspace)
        if session is not None:
            attempt_tokens.place_in_workspace(session, workspace, backend, handle)
        terminal_records.place_in_workspace(workspace, backend, handle)
    except (DomainError, ValueError, WorkspaceError) as exc:
        raise PlacementError(f"{workspace.name}: {exc}") from exc


def restart(
    session: Session,
    workspace: Workspace,
    backend_factory: BackendFactory = backend_for_host,
    actor_id: int | None = None,
) -> None:
    """Bring a dead or stopped workspace back on its host, same submission volume and GPUs.

    Only while its row is still as the caller read it (`_transition`, which holds the row until
    the transaction ends): a workspace another process destroyed meanwhile (its attempt ended)
    raises Conflict rather than being made again, container and volume back to life."""
    host = session.get(Host, workspace.host_id) if workspace.host_id else None
    if host is None or workspace.status not in LIVE:
        raise Conflict(f"workspace {workspace.name} is {workspace.status.value}; cannot restart")
    seen = workspace.status
    if not _transition(session, workspace, seen, seen):
        raise Conflict(
            f"workspace {workspace.name} is {workspace.status.value} now, no longer "
            f"{seen.value}; not restarting it"
        )
    with open_backend(backend_factory, host) as backend:
        handle = handle_of(workspace)
        try:
            recreated = backend.status(handle) is WorkspaceState.MISSING
            if recreated:
                handle = backend.create(_spec(session, workspace))
                workspace.container_id = handle.container_id
            backend.start(handle)
            if recreated:
                try:
                    _after_create(workspace, host, backend, handle)
                except PlacementError:  # recreate it next time rather than run it half set up
                    backend.destroy(handle, keep_submission=True)
                    raise
            elif workspace.purpose is WorkspacePurpose.ATTEMPT and backend.name == "docker":
                terminal_records.start_recorder(backend, handle)  # a stop ended the recorder
        except (WorkspaceError, PlacementError) as exc:
            workspace.status = WorkspaceStatus.DEAD
            workspace.last_error = str(exc)
            session.flush()
            raise PlacementError(f"restarting {workspace.name} failed: {exc}") from exc
    workspace.status = WorkspaceStatus.RUNNING
    workspace.last_error = None
    audit.record(session, "workspace.restart", "workspace", workspace.id, actor_id)
    session.flush()


def stop(
    session: Session, workspace: Workspace, backend_factory: BackendFactory = backend_for_host
) -> None:
    """Stop a workspace no one will work in again (an agent's, once its attempt ended or its
    run failed) and give its GPUs back to the pool.

    The stopped container and its submission volume stay: snapshots still read them, and a
    coordinator can look at what was left. A STOPPED workspace stays so: reconcile restarts only
    DEAD ones and places only PENDING ones (a PENDING one, never placed, is marked STOPPED too,
    so that it never is). The row says STOPPED before the container is stopped (`_claim`), and
    a workspace destroyed meanwhile stays destroyed. GPUs are released only once the container
    no longer runs: while its host does not answer, they stay held and the row says again what
    it said (PlacementError)."""
    seen = _claim(session, workspace, WorkspaceStatus.STOPPED)
    if seen is None:
        return  # destroyed meanwhile: its container and its GPUs went with it
    host = session.get(Host, workspace.host_id) if workspace.host_id else None
    if host is not None:
        handle = handle_of(workspace)
        with _claimed_engine(
            session, workspace, seen, host, backend_factory, "stopping"
        ) as backend:
            if backend.status(handle) is WorkspaceState.RUNNING:
                backend.stop(handle)
    gpu_allocation.release(session, workspace)
    audit.record(session, "workspace.stop", "workspace", workspace.id, None)
    session.flush()


def destroy(
    session: Session,
    workspace: Workspace,
    backend_factory: BackendFactory = backend_for_host,
    *,
    keep_submission: bool = False,
    actor_id: int | None = None,
) -> None:
    """Remove the container (and the volume unless kept) and free the GPUs.

    The row says DESTROYED before the container goes (`_claim`). Should the engine fail, the row
    says again what it said, a live workspace whose container may still be there
    (PlacementError): its caller tries again later, and reconcile does not take it for an
    orphan meanwhile."""
    seen = _claim(session, workspace, WorkspaceStatus.DESTROYED)
    host = session.get(Host, workspace.host_id) if workspace.host_id else None
    if host is not None and seen is not None:
        with _claimed_engine(
            session, workspace, seen, host, backend_factory, "destroying"
        ) as backend:
            backend.destroy(handle_of(workspace), keep_submission=keep_submission)
    gpu_allocation.release(session, workspace)
    egress_gateway.after_destroy(workspace, host)
    workspace.destroyed_at = utcnow()
    audit.record(
        session,
        "workspace.destroy",
        "workspace",
        workspace.id,
        actor_id,
        keep_submission=keep_submission,
    )
    session.flush()


def retire(session: Session, workspace: Workspace, seen: WorkspaceStatus, why: str) -> bool:
    """Mark a workspace destroyed without touching a host, and free its GPUs; True when done.
    One on a host that does not answer keeps its container and volume there (an attempt moved
    off a lost host, `baseline.attempts.host_outage`); one never placed (PENDING: its attempt
    withdrawn) has none.

    Only while its row still says `seen`, the status its caller read (`_transition`): the
    status was written whatever the row said, so a workspace that reconcile restarted meanwhile
    (its host came back) ran on beside the one that replaced it, and one destroyed or stopped
    meanwhile (its attempt ended) was overwritten. False leaves the row as it is now; the caller
    decides what its own work becomes."""
    if not _transition(
        session, workspace, seen, WorkspaceStatus.DESTROYED, destroyed_at=utcnow(), last_error=why
    ):
        return False
    gpu_allocation.release(session, workspace)
    egress_gateway.after_destroy(
        workspace, session.get(Host, workspace.host_id) if workspace.host_id else None
    )
    session.flush()
    return True


@contextmanager
def _claimed_engine(
    session: Session,
    workspace: Workspace,
    seen: WorkspaceStatus,
    host: Host,
    backend_factory: BackendFactory,
    doing: str,
) -> Iterator[WorkspaceBackend]:
    """The host's backend for the stop or destroy of a workspace `_claim`ed from `seen`: an
    engine that fails raises PlacementError ("`doing` NAME failed") and the row says `seen`
    again, a live workspace whose container may still be there."""
    try:
        with open_backend(backend_factory, host) as backend:
            try:
                yield backend
            except WorkspaceError as exc:
                raise PlacementError(f"{doing} {workspace.name} failed: {exc}") from exc
    except PlacementError:
        workspace.status = seen
        session.flush()
        raise


def _claim(session: Session, workspace: Workspace, end: WorkspaceStatus) -> WorkspaceStatus | None:
    """Write `end` (STOPPED or DESTROYED) into the workspace's row before its container is
    touched; the status the row had, to put back should the engine fail, or None when the row
    says destroyed already (nothing left to do).

    The container went first and the row was written after: a reconcile in between read the
    row running, found no running container, marked it dead and restarted it, so a destroyed
    workspace's container and volume came back as orphans and a stopped one ran again, holding
    its GPUs. Reconcile and restart write a row only while it says what they read
    (`_transition`), and this UPDATE holds the row until the caller's transaction ends: one
    that read it running waits, then finds it stopped or destroyed and leaves it.

    Each try is on the status the row was last read with; one fails only when another
    transaction committed a new status since (on SQLite the failed UPDATE holds the write lock,
    so the next try is the last)."""
    while workspace.status is not WorkspaceStatus.DESTROYED:
        seen = workspace.status
        if _transition(session, workspace, seen, end):
            return seen
    return None


# -- reconcile -----------------------------------------------------------------------------


@dataclass
class ReconcileReport:
    removed: dict[str, list[str]] = field(default_factory=dict)  # host -> container names
    died: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    placed: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # host or workspace -> problem


def reconcile(
    session: Session,
    backend_factory: BackendFactory = backend_for_host,
    *,
    restart_dead: bool = True,
    router: egress_gateway.Router | None = None,
    orphan_min_age_s: float = ORPHAN_MIN_AGE_S,
) -> ReconcileReport:
    """Make the hosts agree with the database; run at start-up and periodically (PENDING
    workspaces placed routed by `router`). Containers without a live workspace are removed
    once `orphan_min_age_s` old: a younger one may be another transaction's, still uncommitted.

    A disposable workspace (`DISPOSABLE`) is its job's alone: neither marked dead nor
    restarted here. Its container is gone first when its job destroys it, and the row says
    running until that destroy commits, so reconcile took it for dead and restarted it while
    the job removed its volume: the restart's disk-image script (`infra.disk_images`) ran
    beside the removal's, made `mnt/data` in the host folder the removal had just unmounted,
    and the removal failed, leaving the volume behind (CI's leak check).

    A workspace is marked dead, and restarted, only while its row still says what reconcile
    read (`_transition`), and placed only while it still says pending (`place`): one stopped or
    destroyed meanwhile (its attempt ended) stays so.

    Each host's checks, each restart and each placement is committed as it is done
    (`db.commit_step`). On SQLite a transaction's first write holds the database's write lock
    until it ends, and one transaction held it through every engine call that followed:
    placing the pending workspaces of a study launched onto full hosts, a few seconds each
    (longer over SSH), held back every other write of the portal (a clock event, a login),
    which failed once it had waited the busy timeout (30 s). Now a writer waits for one engine
    operation at most."""
    report = ReconcileReport()
    hosts = session.scalars(select(Host).where(Host.enabled.is_(True)).order_by(Host.name)).all()
    for host in hosts:  # read whole: each host's step is committed before the next is read
        rows = live_workspaces(session, host)
        try:
            with open_backend(backend_factory, host) as backend:
                removed = backend.reconcile({w.name for w in rows}, min_age_s=orphan_min_age_s)
                report.removed[host.name] = removed
                _record_removals(session, host, removed)
                for workspace in rows:
                    if workspace.status is not WorkspaceStatus.RUNNING:
                        continue
                    if workspace.purpose in DISPOSABLE:
                        continue
                    state = backend.status(handle_of(workspace))
                    if state is WorkspaceState.RUNNING:
                        continue
                    error = f"container found {state.value} by reconcile"
                    if not _transition(
                        session, workspace, WorkspaceStatus.RUNNING, WorkspaceStatus.DEAD,
                        last_error=error,
                    ):  # fmt: skip
                        continue  # destroyed or stopped meanwhile: its container went with it
                    audit.record(
                        session,
                        "workspace.died",
                        "workspace",
                        workspace.id,
                        None,
                        state=state.value,
                    )
                    report.died.append(workspace.name)
        except (WorkspaceError, PlacementError) as exc:
            host.healthy = False
            host.last_error = str(exc)
            report.errors[host.name] = str(exc)
            commit_step(session)
            continue
        commit_step(session)
        if restart_dead:
            for workspace in rows:
                if workspace.status is not WorkspaceStatus.DEAD or workspace.purpose in DISPOSABLE:
                    continue
                try:
                    restart(session, workspace, backend_factory)
                    report.restarted.append(workspace.name)
                except Conflict:
                    pass  # no longer dead (destroyed meanwhile): not reconcile's to revive
                except PlacementError as exc:
                    report.errors[workspace.name] = str(exc)
                commit_step(session)
    pending = session.scalars(
        select(Workspace).where(Workspace.status == WorkspaceStatus.PENDING).order_by(Workspace.id)
    )
    for workspace in list(pending):
        try:
            if place(session, workspace, backend_factory, router=router):
                report.placed.append(workspace.name)
        except egress_gateway.EgressUnavailable as exc:
            report.errors[workspace.name] = str(exc)
        commit_step(session)
    return report


def revive(
    session: Session,
    workspace: Workspace,
    error: str,
    backend_factory: BackendFactory = backend_for_host,
) -> None:
    """Restart a workspace that failed under its user (an agent's tool call found it gone),
    marked dead with `error` first: both only while its row still says what was read
    (`_transition`). One destroyed or stopped meanwhile (its attempt ended) raises Conflict
    and stays as it is; writing dead over it would have made it again."""
    seen = workspace.status
    if seen not in (WorkspaceStatus.RUNNING, WorkspaceStatus.DEAD) or not _transition(
        session, workspace, seen, WorkspaceStatus.DEAD, last_error=error
    ):
        raise Conflict(f"workspace {workspace.name} is {workspace.status.value}; not reviving it")
    restart(session, workspace, backend_factory)


def _transition(
    session: Session,
    workspace: Workspace,
    old: WorkspaceStatus,
    new: WorkspaceStatus,
    **values: object,
) -> bool:
    """Set the workspace's row to `new` (and `values`) only while it is `old` in the database;
    True when it was. The object is read again either way, so it shows what the row says.

    One conditional UPDATE, not a write of what was read: a workspace another process destroyed
    between reconcile's read and its write was turned from destroyed back to dead, then
    restarted, its container and volume made again (a lost update). The UPDATE also holds the
    row until the transaction ends (PostgreSQL's row lock, SQLite's write lock), so what follows
    in it (a restart) works on the row as checked."""
    done = session.execute(
        update(Workspace)
        .where(Workspace.id == workspace.id, Workspace.status == old)
        .values(status=new, **values)
        .execution_options(synchronize_session=False)
    )
    session.refresh(workspace)
    return rows_changed(done) == 1


def _record_removals(session: Session, host: Host, names: list[str]) -> None:
    """Every container reconcile removed, logged and audited with the deployment it ran as:
    a removal is never silent, so a wrong one (another portal's workspaces) can be traced."""
    if not names:
        return
    own = deployment()
    for name in names:
        log.warning(
            "reconcile: removed container %s of deployment %s from host %s (no live workspace)",
            name, own, host.name,
        )  # fmt: skip
        audit.record(
            session, "workspace.orphan_removed", "host", host.id, None,
            container=name, deployment=own,
        )  # fmt: skip


def reconcile_job(ctx: Context, *, restart_dead: bool = True) -> ReconcileReport:
    """One reconcile in its own session (committed step by step, `reconcile`), each pending
    workspace placed with the egress route of the host it lands on: the scheduler's (start-up,
    periodic) and `baseline workspace reconcile`'s, which placed them with none (a
    full-internet or blacklist study's workspace got no network)."""
    with ctx.session() as session:
        return reconcile(session, router=egress_gateway.router(ctx), restart_dead=restart_dead)
