"""Exclusive GPU assignment to workspaces, recorded in the database.

The choice of devices is `infra.gpus.choose_devices`; exclusivity is the database's: the partial
unique index `uq_gpu_live` on (host_id, device_index) WHERE released_at IS NULL refuses a second
live assignment of one GPU, whatever two processes decided concurrently. A refused insert is rolled
back to a savepoint (the caller's transaction survives) and the choice is made again against what
is now taken. None means nothing is free now: the caller leaves the attempt pending.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from baseline.errors import Conflict, InvalidInput
from baseline.models import GpuAssignment, Host, Workspace, utcnow
from infra.gpus import (
    CommandRunner,
    GpuDevice,
    InventoryError,
    NvidiaSmiMissing,
    UnsatisfiableRequest,
    choose_devices,
    declared_inventory,
    query_inventory,
)

MAX_TRIES = 8


def inventory(host: Host) -> list[GpuDevice]:
    """The host's recorded GPUs."""
    try:
        return declared_inventory(host.gpus or [])
    except InventoryError as exc:
        raise InvalidInput(f"host {host.name}: GPU inventory is not valid: {exc}") from exc


def _busy(session: Session, host_id: int) -> set[int]:
    rows = session.scalars(
        select(GpuAssignment.device_index).where(
            GpuAssignment.host_id == host_id, GpuAssignment.released_at.is_(None)
        )
    )
    return set(rows)


def live_assignments(session: Session, workspace: Workspace) -> list[GpuAssignment]:
    return list(
        session.scalars(
            select(GpuAssignment)
            .where(GpuAssignment.workspace_id == workspace.id, GpuAssignment.released_at.is_(None))
            .order_by(GpuAssignment.device_index)
        )
    )


def _choose(session: Session, host: Host, count: int, model: str | None) -> list[GpuDevice] | None:
    """`count` free GPUs of `model` on `host` now, None when too few are free; InvalidInput when
    the host can never serve the request."""
    try:
        return choose_devices(inventory(host), _busy(session, host.id), model, count)
    except UnsatisfiableRequest as exc:
        raise InvalidInput(f"host {host.name}: {exc}") from exc


def allocate(
    session: Session, host: Host, workspace: Workspace, count: int, model: str | None
) -> list[GpuAssignment] | None:
    """Assign `count` free GPUs of `model` on `host` to `workspace`; None when too few are free.

    Idempotent per workspace: one that already holds GPUs gets them back unchanged. Raises
    InvalidInput when the host can never serve the request (too few GPUs of that model).
    """
    held = live_assignments(session, workspace)
    if held:
        if len(held) != count or any(a.host_id != host.id for a in held):
            raise Conflict(
                f"workspace {workspace.name} already holds {len(held)} GPU(s) on host "
                f"{held[0].host_id}; release them before asking for {count} on {host.name}"
            )
        return held
    if count == 0:
        return []
    for _ in range(MAX_TRIES):
        chosen = _choose(session, host, count, model)
        if chosen is None:
            return None
        rows = [
            GpuAssignment(
                host_id=host.id,
                device_index=device.index,
                gpu_uuid=device.uuid,
                workspace_id=workspace.id,
            )
            for device in chosen
        ]
        try:
            with session.begin_nested():
                session.add_all(rows)
        except IntegrityError:
            # Another workspace took one of them since we looked: look again.
            continue
        return rows
    return None


def has_room(session: Session, host: Host, count: int, model: str | None) -> bool:
    """Whether `allocate` could give `count` GPUs of `model` on `host` now, read only: a
    workspace waiting for GPUs is checked every reconcile, and claiming it to find no room
    wrote its row twice each time. False also where the host can never serve the request."""
    if count == 0:
        return True
    try:
        return _choose(session, host, count, model) is not None
    except InvalidInput:
        return False


def too_few_free(session: Session, host: Host, count: int, model: str | None) -> bool:
    """Whether `host` has the GPUs for the request but too few of them are free now, read only:
    a job waiting for them asks this before it claims anything. False where the host can never
    serve the request, so that the job's next try says why (`allocate` raises InvalidInput)."""
    if count == 0:
        return False
    try:
        return _choose(session, host, count, model) is None
    except InvalidInput:
        return False


def release(session: Session, workspace: Workspace) -> list[int]:
    """End the workspace's live assignments; returns the device indexes set free."""
    held = live_assignments(session, workspace)
    now = utcnow()
    for assignment in held:
        assignment.released_at = now
    session.flush()
    return [assignment.device_index for assignment in held]


def free_gpus(session: Session, host: Host) -> list[GpuDevice]:
    busy = _busy(session, host.id)
    return [device for device in inventory(host) if device.index not in busy]


def device_ids_of(assignments: Sequence[GpuAssignment]) -> list[str]:
    """The ids for `WorkspaceSpec.gpu_device_ids` (nvidia-smi indexes), ascending."""
    return [str(index) for index in sorted(a.device_index for a in assignments)]


def refresh_inventory(session: Session, host: Host, runner: CommandRunner) -> list[dict[str, Any]]:
    """Re-read the host's GPUs with nvidia-smi; keep the declared ones where it is absent.

    A measured inventory replaces a declared one. A failing nvidia-smi raises InvalidInput (the
    caller marks the host unhealthy) and leaves the recorded inventory as it was.
    """
    try:
        measured = query_inventory(runner)
    except NvidiaSmiMissing:
        if host.gpus_declared:
            return list(host.gpus)
        host.gpus = []
        session.flush()
        return []
    except InventoryError as exc:
        raise InvalidInput(f"host {host.name}: GPU inventory failed: {exc}") from exc
    host.gpus = [device.model_dump() for device in measured]
    host.gpus_declared = False
    session.flush()
    return list(host.gpus)
