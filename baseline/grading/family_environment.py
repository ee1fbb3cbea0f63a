"""Where a Task Standard family's attempt is scored: in the task's own environment.

Vivaria scores a family inside the environment the task ran in, GPUs included. Here an
intermediate score is taken in the live attempt's workspace state, and the final snapshot's score
in the state the attempt ended in (saved before the family's teardown,
`family_launch.run_teardown`), both with the attempt's whole submission volume
(`scoring.task_standard_scoring`). Other snapshots (interval, manual) are scored from their files
in a fresh container of the attempt's image, as every scored task's are: the environment then is
not the one they were taken in. When the attempt's workspace is gone (destroyed, its volume with
it), the final snapshot is scored that way too, and the grading says so (``scored_in``).

The scoring container gets GPUs as the task's environment has them. An intermediate score gets
the live workspace's own (its live assignments, as its family's start does). The final score
comes after the attempt ended and its workspace gave its GPUs back: the attempt's hardware
profile's GPUs on its host are taken from the pool for the scoring alone, held by a workspace row
of purpose SCORING (the allocation keys on workspaces; reconcile leaves such rows to their job,
and the grading names it so that recovery destroys it should the scoring's process die), and
given back when the scoring ends, however it ends (should its host's engine not answer then,
`claims.sweep_disposable` destroys it later). The scoring container carries that row's
name, so that its destroy removes it too. When the host has too few free GPUs now, the scoring
raises `NoRoom`: the grading waits in the queue and is tried again, as a script scoring with no
room does. A family that asks for GPUs is never scored on a CPU in their place.

The scoring container, and the state saved for that one scoring when there is none to score in
(the live container's whole file system, many GB maybe: an intermediate score's, or a final
score's whose ended state is not on the engine), are named after one name that the score's row
records before either exists (an intermediate score's ScoreLog, the final score's grading), so
that recovery removes both should the scoring's process die; nothing else would, and the
container ran on past its time-out. A final score with GPUs is named after its SCORING
workspace, whose destroy removes both (`infra.docker_backend.DockerBackend.destroy`); any other
scoring has no workspace of its own and is a scoring run (`infra.family_run.scoring_run_name`),
removed by that name (`remove_scoring_run`). What recovery could not remove while its host was
down, and what a run's own best-effort removal left, the sweep removes once no running row
names it and it is older than an unnamed workspace's grace (`sweep_scoring_runs`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import docker
from sqlalchemy import Text, select
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import Session

from baseline import audit
from baseline.context import Context
from baseline.errors import InvalidInput
from baseline.grading.reproductions import NoRoom, destroy_or_leave
from baseline.models import (
    Attempt,
    Grading,
    Host,
    ScoreLog,
    Snapshot,
    SnapshotKind,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.tasks.task_families import FAMILY_DIR, standard_of
from baseline.workspaces import gpu_allocation
from baseline.workspaces.backends import deployment_labels
from baseline.workspaces.workspaces import (
    BackendFactory,
    PlacementError,
    new_workspace_name,
    open_backend,
)
from infra import family_run
from infra.docker_backend import DockerBackend
from infra.hardware import ProfileConfigError, load_profiles
from scoring.scored_task import ScoringSpec
from scoring.scoring_run import ScoringError, ScoringResult
from scoring.task_standard import Resources
from scoring.task_standard_scoring import score_in_environment

SCORED_IN_ENVIRONMENT = "task environment"
SCORED_IN_SNAPSHOT = "snapshot"
DEFAULT_MEMORY_MB = 4096  # a profile no longer configured

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Environment:
    """An attempt's workspace to score in: its host, container and submission volume, and the
    GPUs its scoring gets."""

    host: Host
    container_id: str
    submission_volume: str
    image: str
    hardware_profile: str
    memory_mb: int
    gpu: bool  # the family asks for GPUs
    gpu_ids: tuple[str, ...]  # the live workspace's, for an intermediate score
    gpu_count: int  # the profile's, taken from the pool for the final score
    gpu_model: str | None
    final: bool  # the ended attempt's saved state, not the container as it is now


def _environment(session: Session, attempt: Attempt, *, final: bool) -> Environment | None:
    standard = standard_of(attempt)
    if standard is None:
        return None
    workspace = session.scalar(
        select(Workspace)
        .where(
            Workspace.attempt_id == attempt.id,
            Workspace.purpose == WorkspacePurpose.ATTEMPT,
            Workspace.status != WorkspaceStatus.DESTROYED,
        )
        .order_by(Workspace.id.desc())
    )
    if workspace is None or workspace.host_id is None or not workspace.container_id:
        return None
    if not workspace.submission_volume:
        return None
    host = session.get(Host, workspace.host_id)
    if host is None:
        return None
    try:
        profile = load_profiles().get(attempt.hardware_profile)
    except ProfileConfigError:
        profile = None
    live = gpu_allocation.live_assignments(session, workspace)
    return Environment(
        host=host,
        container_id=workspace.container_id,
        submission_volume=workspace.submission_volume,
        image=workspace.image_digest or workspace.image,
        hardware_profile=attempt.hardware_profile,
        memory_mb=profile.memory_mb if profile is not None else DEFAULT_MEMORY_MB,
        gpu=Resources.model_validate(standard.get("resources", {})).gpu is not None,
        gpu_ids=() if final else tuple(gpu_allocation.device_ids_of(live)),
        gpu_count=profile.gpu_count if profile is not None else 0,
        gpu_model=profile.gpu_model if profile is not None else None,
        final=final,
    )


def for_intermediate(session: Session, attempt: Attempt) -> Environment | None:
    """The live attempt's environment, for a family task; None for other tasks."""
    return _environment(session, attempt, final=False)


def for_grading(session: Session, snapshot: Snapshot) -> Environment | None:
    """The ended attempt's environment for its final snapshot of a family task; None otherwise
    (other snapshots, other tasks, a workspace no longer there)."""
    if snapshot.kind is not SnapshotKind.FINAL:
        return None
    return _environment(session, snapshot.attempt, final=True)


@dataclass(frozen=True)
class ScoringGpus:
    """The GPUs one scoring's container gets, and its name when a SCORING workspace holds them
    (None: the live workspace's own, or none)."""

    ids: tuple[str, ...]
    name: str | None


def _gpus_wanted(environment: Environment) -> str:
    return f"{environment.gpu_count} GPU(s) of profile {environment.hardware_profile}"


def _no_room(environment: Environment) -> NoRoom:
    return NoRoom(
        f"the final score needs {_gpus_wanted(environment)} on host {environment.host.name}, "
        "where the attempt's ended state is, and too few are free now: it waits in the queue "
        "and is tried again"
    )


def still_too_few_gpus(session: Session, environment: Environment, error: str | None) -> bool:
    """Whether a final score whose grading waits for its host's GPUs (`error` says so) still
    finds too few free, asked read only. Each try, one a pass for as long as they stayed taken,
    claimed the grading, started its heartbeat, named a SCORING workspace on it, inserted that
    row (rolled back), found no room and queued the grading again. The first try still goes
    that way and records why it waits."""
    if not environment.final or error != str(_no_room(environment)):
        return False
    return gpu_allocation.too_few_free(
        session, environment.host, environment.gpu_count, environment.gpu_model
    )


@contextmanager
def _scoring_gpus(
    ctx: Context,
    environment: Environment,
    backend_factory: BackendFactory,
    on_named: Callable[[str], None] | None,
) -> Iterator[ScoringGpus]:
    """The GPUs for this scoring: the live workspace's for an intermediate score; for the final
    score, the profile's, taken on the attempt's host (its saved state is on that engine) by a
    SCORING workspace and given back (the workspace destroyed) when the block ends, however it
    ends. `on_named` is told that workspace's name before its row is made, so that a runner that
    dies once it stands has named it for recovery (`claims.remove_workspace`); one no job
    names held its GPUs until the sweep's grace (`claims.UNNAMED_GRACE_S`). Raises NoRoom when
    the host has too few free now."""
    if not environment.final or environment.gpu_count == 0:
        yield ScoringGpus(ids=environment.gpu_ids, name=None)
        return
    name = new_workspace_name(WorkspacePurpose.SCORING)
    if on_named is not None:  # named before the row stands: no runner's death leaves it unnamed
        on_named(name)
    with ctx.session() as session:
        host = session.get(Host, environment.host.id)
        if host is None:
            raise ScoringError(f"the attempt's host {environment.host.name} is gone")
        workspace = Workspace(
            purpose=WorkspacePurpose.SCORING,
            backend=DockerBackend.name,
            name=name,
            image=environment.image,
            hardware_profile=environment.hardware_profile,
            network="none",
            host_id=host.id,
            status=WorkspaceStatus.CREATING,
        )
        session.add(workspace)
        session.flush()
        try:
            held = gpu_allocation.allocate(
                session, host, workspace, environment.gpu_count, environment.gpu_model
            )
            refused = None
        except InvalidInput as exc:  # the host can never give them
            held, refused = None, exc
        if held is None:  # raising rolls the row back: nothing was held
            if refused is not None:
                raise ScoringError(f"the final score needs {_gpus_wanted(environment)}: {refused}")
            raise _no_room(environment)
        workspace.status = WorkspaceStatus.RUNNING
        audit.record(
            session,
            "workspace.request",
            "workspace",
            workspace.id,
            None,
            profile=environment.hardware_profile,
            host=host.name,
            gpus=gpu_allocation.device_ids_of(held),
        )
        workspace_id = workspace.id
        gpus = ScoringGpus(ids=tuple(gpu_allocation.device_ids_of(held)), name=name)
    try:
        yield gpus
    finally:  # its container too, should one remain; left to the sweep when it cannot be now
        destroy_or_leave(ctx, workspace_id, backend_factory)


@contextmanager
def _engine(backend_factory: BackendFactory, host: Host) -> Iterator[docker.DockerClient]:
    """The Docker client of the host's backend, closed after the block (an ssh:// one holds a
    connection)."""
    with open_backend(backend_factory, host) as backend:
        client = getattr(backend, "client", None)
        if not isinstance(client, docker.DockerClient):
            raise ScoringError("a family is scored in its environment, which needs a Docker host")
        yield client


def score(
    ctx: Context,
    environment: Environment,
    spec: ScoringSpec,
    score_log: dict[str, bytes],
    backend_factory: BackendFactory,
    on_named: Callable[[str], None] | None = None,
) -> ScoringResult:
    """Run the family's scoring hook (`spec`) in the environment with its GPUs (`_scoring_gpus`);
    `score_log` is `task_families.score_log_material` (empty unless the family aggregates its
    scores). `on_named` is told, before it stands, what recovery removes should this process
    die: the final score's SCORING workspace when it holds GPUs (its destroy removes the
    scoring's container and the state saved for it), else the scoring run (its container and
    the state saved for it, `remove_scoring_run`)."""
    files = {path.removeprefix(f"{FAMILY_DIR}/"): data for path, data in score_log.items()}
    with _scoring_gpus(ctx, environment, backend_factory, on_named) as gpus:
        if environment.gpu and not gpus.ids:
            why = (
                f"profile {environment.hardware_profile} has none"
                if environment.final
                else "its workspace holds none"
            )
            raise ScoringError(
                f"this family asks for GPUs and its scoring would get none ({why}): it is not "
                "scored on a CPU in their place"
            )
        name = gpus.name
        if name is None:  # no SCORING workspace: the run is named on its own
            name = family_run.scoring_run_name()
            if on_named is not None:  # named before it stands, as a scoring workspace is
                on_named(name)
        with _engine(backend_factory, environment.host) as client:
            return score_in_environment(
                client,
                container_id=environment.container_id,
                submission_volume=environment.submission_volume,
                spec=spec,
                files=files,
                memory_mb=environment.memory_mb,
                final=environment.final,
                gpu_ids=gpus.ids,
                name=name,
                labels=deployment_labels(),
            )


def remove_scoring_run(
    session: Session, attempt_id: int, name: str, backend_factory: BackendFactory
) -> bool:
    """Remove a scoring run `name` of the attempt (its container, killed if it still runs, and
    the state saved for it) from the engine of each host its attempt's workspaces were placed on
    (it ran where the live workspace runs, or where the ended one's state was saved); False,
    logged, when one does not answer now."""
    placed_on = select(Workspace.host_id).where(
        Workspace.attempt_id == attempt_id, Workspace.purpose == WorkspacePurpose.ATTEMPT
    )
    hosts = session.scalars(select(Host).where(Host.id.in_(placed_on)).order_by(Host.id))
    removed = True
    for host in hosts:
        try:
            with _engine(backend_factory, host) as client:
                family_run.remove_scoring_run(client, name)
        except (family_run.FamilyRunError, PlacementError, ScoringError) as exc:
            log.warning("scoring run %s not removed from host %s: %s", name, host.name, exc)
            removed = False
    return removed


def _scoring_run_hosts(session: Session) -> list[Host]:
    """The enabled, healthy hosts of the attempts that an intermediate score or a grading ever
    named a scoring run for (`family_run.scoring_run_name`)."""
    prefix = family_run.SCORING_RUN_PREFIX
    scored = select(ScoreLog.attempt_id).where(ScoreLog.workspace.startswith(prefix))
    graded = (
        select(Snapshot.attempt_id)
        .join(Grading, Grading.snapshot_id == Snapshot.id)
        .where(sql_cast(Grading.config, Text).contains(f'"{prefix}', autoescape=True))
    )
    placed_on = select(Workspace.host_id).where(
        Workspace.purpose == WorkspacePurpose.ATTEMPT,
        Workspace.attempt_id.in_(scored.union(graded)),
    )
    return list(
        session.scalars(
            select(Host)
            .where(Host.id.in_(placed_on), Host.enabled.is_(True), Host.healthy.is_(True))
            .order_by(Host.id)
        )
    )


def sweep_scoring_runs(
    session: Session,
    held: Callable[[], set[str]],
    made_before: datetime,
    backend_factory: BackendFactory,
) -> list[str]:
    """Remove from every enabled, healthy Docker host the scoring runs of this deployment
    (containers and state images, `family_run.scoring_runs`) that no running row names (`held`,
    read after the engine's list: a run named after that read was named before it, or is
    younger than the cutoff) and that were made before `made_before`; the names removed.

    Recovery removes what a dead runner named, but only while the host answers: an
    intermediate score is closed all the same (its participant's clock must not wait for the
    host), and a run's own removal at its end is best effort. Either left a container, maybe
    still running, and a copy of a workspace's whole file system on the host for good. A host
    that does not answer, or is no Docker host, is left for the next sweep. Only the hosts of
    attempts a row ever named a scoring run for are asked (a run is named before it stands):
    most studies have no family task, and their hosts are not asked every minute for nothing."""
    scope = deployment_labels()  # another portal's runs on a shared engine are not ours
    cutoff = made_before.timestamp()
    removed: list[str] = []
    for host in _scoring_run_hosts(session):
        try:
            with _engine(backend_factory, host) as client:
                runs = family_run.scoring_runs(client, scope)
                named = held()  # read after the engine's list
                for name in sorted(runs):
                    if runs[name] >= cutoff or name in named:
                        continue
                    log.warning(
                        "scoring run %s on %s: no run holds it; removing it", name, host.name
                    )
                    family_run.remove_scoring_run(client, name)
                    removed.append(name)
        except (family_run.FamilyRunError, PlacementError, ScoringError) as exc:
            log.warning("scoring runs on host %s not swept: %s", host.name, exc)
    return removed
