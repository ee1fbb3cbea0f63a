"""A workspace row holding a host's GPUs, for tests of what waits while none is free."""

from __future__ import annotations

from sqlalchemy.orm import Session

from baseline.models import Host, Workspace, WorkspacePurpose, WorkspaceStatus
from baseline.workspaces import gpu_allocation, workspaces
from tests.docker_env import LOCAL_URL, new_name

A10 = "NVIDIA A10"


def holding_gpus(session: Session, host: Host, count: int = 1, model: str = A10) -> Workspace:
    """A running attempt's workspace on `host` (no container) holding `count` of its GPUs."""
    holder = Workspace(
        purpose=WorkspacePurpose.ATTEMPT,
        backend="docker",
        name=new_name("holder"),
        image="x",
        hardware_profile="a10",
        status=WorkspaceStatus.RUNNING,
        host_id=host.id,
    )
    session.add(holder)
    session.flush()
    assert gpu_allocation.allocate(session, host, holder, count, model)
    return holder


def full_gpu_host(session: Session, name: str = "gpu-full") -> Host:
    """A healthy host on the local engine with one A10, which a participant's workspace holds."""
    host = workspaces.add_host(
        session, name, LOCAL_URL, None, declared_gpus=[{"model": A10, "count": 1}]
    )
    host.healthy = True
    holding_gpus(session, host)
    return host
