"""Where a Task Standard family's attempt is scored: in the task's own environment.

Vivaria scores a family inside the environment the task ran in. Here an intermediate score is
taken in the live attempt's workspace state, and the final snapshot's score in the state the
attempt ended in (saved before the family's teardown, `family_launch.run_teardown`), both with the
attempt's whole submission volume (`scoring.task_standard_scoring`). Other snapshots (interval,
manual) are scored from their files in a fresh container of the attempt's image, as every scored
task's are: the environment then is not the one they were taken in. When the attempt's
workspace is gone (destroyed, its volume with it), the final snapshot is scored that way too, and
the grading says so (``scored_in``).
"""

from __future__ import annotations

from dataclasses import dataclass

import docker
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.models import (
    Attempt,
    Host,
    Snapshot,
    SnapshotKind,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.tasks.task_families import FAMILY_DIR, standard_of
from baseline.workspaces.workspaces import BackendFactory
from infra.hardware import ProfileConfigError, load_profiles
from scoring.scored_task import ScoringSpec
from scoring.scoring_run import ScoringError, ScoringResult
from scoring.task_standard import Resources
from scoring.task_standard_scoring import score_in_environment

SCORED_IN_ENVIRONMENT = "task environment"
SCORED_IN_SNAPSHOT = "snapshot"
DEFAULT_MEMORY_MB = 4096  # a profile no longer configured


@dataclass(frozen=True)
class Environment:
    """An attempt's workspace to score in: its host, container and submission volume."""

    host: Host
    container_id: str
    submission_volume: str
    memory_mb: int
    gpu: bool
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
    return Environment(
        host=host,
        container_id=workspace.container_id,
        submission_volume=workspace.submission_volume,
        memory_mb=profile.memory_mb if profile is not None else DEFAULT_MEMORY_MB,
        gpu=Resources.model_validate(standard.get("resources", {})).gpu is not None,
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


def _client(backend: object) -> docker.DockerClient:
    client = getattr(backend, "client", None)
    if not isinstance(client, docker.DockerClient):
        raise ScoringError("a family is scored in its environment, which needs a Docker host")
    return client


def score(
    environment: Environment,
    spec: ScoringSpec,
    score_log: dict[str, bytes],
    backend_factory: BackendFactory,
) -> ScoringResult:
    """Run the family's scoring hook (`spec`) in the environment; `score_log` is
    `task_families.score_log_material` (empty unless the family aggregates its scores)."""
    if environment.gpu:
        raise ScoringError(
            "this family asks for GPUs and its scoring container cannot be given the attempt's "
            "GPUs yet: it is not scored on a CPU in their place"
        )
    files = {path.removeprefix(f"{FAMILY_DIR}/"): data for path, data in score_log.items()}
    backend = backend_factory(environment.host)
    try:
        return score_in_environment(
            _client(backend),
            container_id=environment.container_id,
            submission_volume=environment.submission_volume,
            spec=spec,
            files=files,
            memory_mb=environment.memory_mb,
            final=environment.final,
        )
    finally:
        close = getattr(backend, "close", None)
        if callable(close):
            close()
