"""Rows of a Task Standard family's attempt written by hand, for tests that run a family's start
or scoring on a fake engine: a study, its family task, an agent and its attempt, on a host."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from baseline.models import (
    Attempt,
    AttemptStatus,
    EgressPolicy,
    GpuAssignment,
    Host,
    Study,
    Task,
    TaskKind,
    Workspace,
)
from tests.baseline.attempt_world import agent_attempt_rows


def family_attempt(
    session: Session,
    host: Host,
    *,
    family: str,
    scoring: dict[str, Any],
    profile: str,
    egress: EgressPolicy,
    status: AttemptStatus,
    image_digest: str | None = None,
) -> Attempt:
    """An agent's attempt of task ``FAMILY-main`` (scored by `scoring`, its ``task_standard``
    among it) in a study of `profile` and `egress`; `host` is added beside them."""
    study = Study(name=f"{family} study", egress_policy=egress, hardware_profile=profile)
    task = Task(
        slug=f"{family}-main",
        title=family,
        kind=TaskKind.SCORED,
        content_hash="0" * 64,
        scoring=scoring,
    )
    session.add_all([study, task, host])
    session.flush()
    return agent_attempt_rows(
        session, study, task, hardware_profile=profile, status=status, image_digest=image_digest
    )


def hold_gpus(session: Session, workspace: Workspace, indices: Iterable[int]) -> None:
    """Assign the GPUs `indices` of the workspace's host to it."""
    assert workspace.host_id is not None
    for index in indices:
        session.add(
            GpuAssignment(host_id=workspace.host_id, device_index=index, workspace_id=workspace.id)
        )
