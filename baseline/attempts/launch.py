"""Launching attempts: from a created attempt to a running workspace and a started clock.

Launch places the attempt's workspace (the study's hardware profile, the workspace image of that
profile, the participant-visible task files read-only, the network the study's egress policy
allows: none, or for `open` and `blacklist` the filtering proxy of the egress gateway of the host
the workspace is placed on, which logs every request). When a host has room the clock starts at
once (an agent's runs, a human's waits for the first login); when none has, the attempt stays
visibly PENDING and `start_placed_attempts`, run periodically by the scheduler, starts it as soon
as reconcile has placed its workspace. A proxied workspace's proxy answers before its clock
starts (`egress_gateway.ensure_attempt_proxy`), and before its family's start. An attempt of a
Task Standard family is checked before placement and its family's start runs before the clock
starts (`baseline.attempts.family_launch`). A closed or archived study launches nothing: its
pending attempts are refused at launch (`check_launchable`) and never started by
`start_placed_attempts`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import docker
from docker.errors import DockerException
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.attempts import attempts, family_launch
from baseline.attempts.snapshots import resolve_source
from baseline.context import Context
from baseline.errors import Conflict, InvalidInput, NotFound
from baseline.models import (
    Attempt,
    AttemptStatus,
    Study,
    StudyStatus,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.tasks import tasks
from baseline.workspaces import egress_gateway, workspaces
from infra.blobs import BlobStore
from infra.hardware import ProfileConfigError
from infra.image_build import ImageBuildError, build_workspace_image

log = logging.getLogger(__name__)

# A study in these states is finished: no attempt of it starts working any more.
NOT_LAUNCHING = (StudyStatus.CLOSED, StudyStatus.ARCHIVED)

ImageResolver = Callable[[str], str]
LOCAL_ENGINE = egress_gateway.LOCAL_ENGINE


def default_image(profile: str) -> str:
    """The workspace image of a profile, built once on the local engine and reused after."""
    try:
        client = docker.DockerClient(base_url=LOCAL_ENGINE, use_ssh_client=False)
    except DockerException as exc:
        raise InvalidInput(f"the local Docker Engine is not reachable: {exc}") from exc
    try:
        return build_workspace_image(client, profile).tag
    except (ImageBuildError, ProfileConfigError, DockerException) as exc:
        raise InvalidInput(
            f"the workspace image of profile {profile!r} cannot be built: {exc}"
        ) from exc
    finally:
        client.close()


def task_directory(session: Session, ctx: Context, attempt: Attempt) -> Path:
    """The participant-visible files of the attempt's task, materialised once per content."""
    target = ctx.settings.home / "task-files" / attempt.task.content_hash
    if not target.exists():
        staging = target.with_name(target.name + ".partial")
        tasks.materialize_task_files(
            session, BlobStore(ctx.settings.blob_dir), attempt.task, staging
        )
        staging.rename(target)
    return target


def check_launchable(attempt: Attempt) -> None:
    """A closed or archived study takes no new work, so its pending attempts are not launched:
    a launch would start a clock (and a workspace) in a study whose results are final."""
    study = attempt.study
    if study.status in NOT_LAUNCHING:
        raise Conflict(
            f"attempt {attempt.id} not launched: study {study.name!r} is {study.status.value}, "
            "so its pending attempts are not launched (make it active again to launch them)"
        )


def launch(
    ctx: Context,
    attempt_id: int,
    actor_id: int | None,
    image: str | None = None,
    image_resolver: ImageResolver = default_image,
    backend_factory: workspaces.BackendFactory = workspaces.backend_for_host,
) -> AttemptStatus:
    """Request the attempt's workspace and, when it is placed, start the clock."""
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None:
            raise NotFound(f"no attempt with id {attempt_id}")
        if attempt.status is not AttemptStatus.PENDING or attempt.started_at is not None:
            raise Conflict(f"attempt {attempt_id} was launched already ({attempt.status.value})")
        check_launchable(attempt)
        existing = session.scalar(
            select(Workspace).where(
                Workspace.attempt_id == attempt_id,
                Workspace.purpose == WorkspacePurpose.ATTEMPT,
                Workspace.status != WorkspaceStatus.DESTROYED,
            )
        )
        if existing is not None:
            raise Conflict(f"attempt {attempt_id} has a workspace already ({existing.name})")
        family_launch.check_launch(session, attempt)
        name = workspaces.new_workspace_name(WorkspacePurpose.ATTEMPT, attempt)
        base = image or image_resolver(attempt.hardware_profile)
        store = BlobStore(ctx.settings.blob_dir)
        workspaces.request_workspace(
            session,
            image=family_launch.family_image(session, store, attempt, base, LOCAL_ENGINE),
            hardware_profile=attempt.hardware_profile,
            attempt=attempt,
            task_dir=task_directory(session, ctx, attempt),
            name=name,
            actor_id=actor_id,
            backend_factory=backend_factory,
            router=egress_gateway.router(ctx),
        )
        placed = attempt.status is AttemptStatus.READY
    if placed:
        egress_gateway.ensure_attempt_proxy(ctx, attempt_id)  # a full_internet start goes out
        if family_launch.start_family(ctx, attempt_id, actor_id, backend_factory):
            attempts.start(ctx, attempt_id, actor_id, resolve_source, wait_for_driver=True)
    with ctx.session() as session:
        status = session.get(Attempt, attempt_id)
        assert status is not None
        return status.status


def start_placed_attempts(
    ctx: Context, backend_factory: workspaces.BackendFactory = workspaces.backend_for_host
) -> list[int]:
    """Start the clocks of attempts whose workspace was placed after they were launched; not
    those of a study closed or archived meanwhile (they start if it is made active again)."""
    with ctx.session() as session:
        ready = session.scalars(
            select(Attempt.id)
            .join(Workspace, Workspace.attempt_id == Attempt.id)
            .join(Study, Study.id == Attempt.study_id)
            .where(
                Attempt.status == AttemptStatus.READY,
                Attempt.started_at.is_(None),
                Workspace.status == WorkspaceStatus.RUNNING,
                Study.status.not_in(NOT_LAUNCHING),
            )
        ).all()
    started = []
    for attempt_id in ready:
        try:
            # Placed by another process (reconcile), whose proxy may be gone: it listens first,
            # before the family's start, which goes out through it when the task may.
            egress_gateway.ensure_attempt_proxy(ctx, attempt_id)
            if not family_launch.start_family(ctx, attempt_id, None, backend_factory):
                continue
            attempts.start(ctx, attempt_id, None, resolve_source, wait_for_driver=True)
            started.append(attempt_id)
        except egress_gateway.EgressUnavailable as exc:
            log.warning("attempt %s not started, its egress proxy is unavailable: %s",
                        attempt_id, exc)  # fmt: skip
        except Conflict as exc:
            log.info("attempt %s not started: %s", attempt_id, exc)
    return started
