"""The backend that reaches a host's Docker Engine, and a workspace's handle on it.

Below placement (`workspaces`) so that the modules placement calls into (terminal records, the
family start, the host outage) can reach a workspace's container without importing placement back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from baseline.errors import DomainError
from baseline.models import Host, Workspace
from infra.docker_backend import DockerBackend
from infra.workspace import WorkspaceBackend, WorkspaceError, WorkspaceHandle

BackendFactory = Callable[[Host], WorkspaceBackend]
DEPLOYMENT_LABEL = "baseline.deployment"


class PlacementError(DomainError):
    """A workspace could not be created on the host chosen for it."""


def deployment_labels() -> dict[str, str]:
    """Scope of this deployment's containers: reconcile never touches another deployment's
    (or a test run's) containers on a shared engine. BASELINE_DEPLOYMENT names it."""
    return {DEPLOYMENT_LABEL: os.environ.get("BASELINE_DEPLOYMENT", "default")}


def backend_for_host(host: Host) -> WorkspaceBackend:
    """The Docker backend for a host's URL (unix:// socket or ssh://user@host); every workspace
    it makes is bounded by its profile's disk size (see `DockerBackend`)."""
    try:
        return DockerBackend.from_url(host.docker_url, labels=deployment_labels(), disk_quota=True)
    except WorkspaceError as exc:
        raise PlacementError(f"host {host.name}: {exc}") from exc


@contextmanager
def open_backend(factory: BackendFactory, host: Host) -> Iterator[WorkspaceBackend]:
    """The host's backend for the block, closed after it (an ssh:// backend holds a connection)."""
    backend = factory(host)
    try:
        yield backend
    finally:
        close = getattr(backend, "close", None)
        if callable(close):
            close()


def handle_of(workspace: Workspace) -> WorkspaceHandle:
    return WorkspaceHandle(
        name=workspace.name,
        backend=workspace.backend,
        container_id=workspace.container_id or "",
        image_digest=workspace.image_digest,
        submission_volume=workspace.submission_volume or f"{workspace.name}-submission",
    )
