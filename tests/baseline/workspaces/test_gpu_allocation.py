"""Exclusive GPU assignment on a real database (SQLite file in WAL mode, and PostgreSQL when
BASELINE_TEST_POSTGRES_URL is set), including concurrent create and destroy from real threads."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from baseline.context import Context
from baseline.errors import Conflict, InvalidInput
from baseline.models import (
    GpuAssignment,
    Host,
    Workspace,
    WorkspacePurpose,
    WorkspaceStatus,
    utcnow,
)
from baseline.workspaces import gpu_allocation
from infra.gpus import CommandResult

A10 = "NVIDIA A10"
H100 = "NVIDIA H100 80GB HBM3"


def make_host(ctx: Context, models: Sequence[str], name: str = "gpu-host") -> int:
    with ctx.session() as session:
        host = Host(
            name=name,
            docker_url="ssh://baseline@10.0.0.1",
            healthy=True,
            gpus=[{"index": i, "uuid": f"GPU-{i}", "model": m} for i, m in enumerate(models)],
            gpus_declared=True,
        )
        session.add(host)
        session.flush()
        return host.id


def make_workspace(session, name: str | None = None) -> Workspace:  # type: ignore[no-untyped-def]
    workspace = Workspace(
        purpose=WorkspacePurpose.ATTEMPT,
        backend="docker",
        name=name or f"ws-{uuid.uuid4().hex[:10]}",
        image="baseline/workspace@sha256:0",
        hardware_profile="a10",
    )
    session.add(workspace)
    session.flush()
    return workspace


def live_rows(ctx: Context) -> list[tuple[int, int, int]]:
    with ctx.session() as session:
        return [
            (row[0], row[1], row[2])
            for row in session.execute(
                select(
                    GpuAssignment.host_id, GpuAssignment.device_index, GpuAssignment.workspace_id
                ).where(GpuAssignment.released_at.is_(None))
            )
        ]


def test_allocate_release_and_free(ctx: Context) -> None:
    host_id = make_host(ctx, [A10, A10, H100, A10])
    with ctx.session() as session:
        host = session.get(Host, host_id)
        assert host is not None
        first = make_workspace(session)
        got = gpu_allocation.allocate(session, host, first, 2, "A10")
        assert got is not None
        assert gpu_allocation.device_ids_of(got) == ["0", "1"]
        assert [a.gpu_uuid for a in got] == ["GPU-0", "GPU-1"]
        # Asking again for the same workspace gives the same GPUs, not two more.
        assert gpu_allocation.allocate(session, host, first, 2, "A10") == got
        with pytest.raises(Conflict):
            gpu_allocation.allocate(session, host, first, 1, "A10")
        second = make_workspace(session)
        assert gpu_allocation.allocate(session, host, second, 2, "A10") is None  # only #3 free
        h100 = gpu_allocation.allocate(session, host, second, 1, "H100")
        assert h100 is not None and gpu_allocation.device_ids_of(h100) == ["2"]
        assert [d.index for d in gpu_allocation.free_gpus(session, host)] == [3]
        assert gpu_allocation.release(session, first) == [0, 1]
        assert gpu_allocation.release(session, first) == []
        assert [d.index for d in gpu_allocation.free_gpus(session, host)] == [0, 1, 3]
        with pytest.raises(InvalidInput, match="4 x A10"):
            gpu_allocation.allocate(session, host, make_workspace(session), 4, "A10")
    # Recorded: released rows keep their history, live rows are only the H100.
    assert [(d, w) for _, d, w in live_rows(ctx)] == [(2, h100[0].workspace_id)]
    with ctx.session() as session:
        assert session.scalar(select(func.count()).select_from(GpuAssignment)) == 3


def test_the_index_refuses_a_second_live_assignment(ctx: Context) -> None:
    host_id = make_host(ctx, [A10])
    with ctx.session() as session:
        one, two = make_workspace(session), make_workspace(session)
        session.add(GpuAssignment(host_id=host_id, device_index=0, workspace_id=one.id))
        session.flush()
        with pytest.raises(IntegrityError), session.begin_nested():
            session.add(GpuAssignment(host_id=host_id, device_index=0, workspace_id=two.id))
        # A released assignment does not count.
        session.add(
            GpuAssignment(
                host_id=host_id, device_index=0, workspace_id=two.id, released_at=utcnow()
            )
        )


def test_a_stale_choice_is_retried_on_integrity_error(
    ctx: Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two allocators both saw GPU 0 free: the index refuses the second, which chooses again."""
    host_id = make_host(ctx, [A10, A10])
    with ctx.session() as session:
        winner = make_workspace(session)
        session.add(GpuAssignment(host_id=host_id, device_index=0, workspace_id=winner.id))
    real_busy = gpu_allocation._busy
    stale: Iterator[set[int]] = iter(
        [set()]
    )  # the first look misses the winner's row, as a concurrent one would

    def busy(session, host_id_):  # type: ignore[no-untyped-def]
        return next(stale, None) or real_busy(session, host_id_)

    monkeypatch.setattr(gpu_allocation, "_busy", busy)
    with ctx.session() as session:
        host = session.get(Host, host_id)
        assert host is not None
        loser = make_workspace(session)
        got = gpu_allocation.allocate(session, host, loser, 1, "A10")
        assert got is not None and [a.device_index for a in got] == [1]
        loser_id = loser.id
    assert sorted((d, w) for _, d, w in live_rows(ctx)) == [(0, winner.id), (1, loser_id)]


def test_refresh_inventory_measured_declared_and_failing(ctx: Context) -> None:
    host_id = make_host(ctx, [A10])
    smi = "0, GPU-aa, NVIDIA H100 80GB HBM3, 81559\n1, GPU-bb, NVIDIA H100 80GB HBM3, 81559\n"
    with ctx.session() as session:
        host = session.get(Host, host_id)
        assert host is not None
        missing = gpu_allocation.refresh_inventory(
            session, host, lambda argv: CommandResult(127, "", "nvidia-smi: not found")
        )
        assert missing == [{"index": 0, "uuid": "GPU-0", "model": A10}]  # declared kept
        with pytest.raises(InvalidInput, match="exited 9"):
            gpu_allocation.refresh_inventory(
                session, host, lambda argv: CommandResult(9, "", "couldn't communicate")
            )
        measured = gpu_allocation.refresh_inventory(
            session, host, lambda argv: CommandResult(0, smi, "")
        )
        assert [g["uuid"] for g in measured] == ["GPU-aa", "GPU-bb"]
    with ctx.session() as session:
        host = session.get(Host, host_id)
        assert host is not None and host.gpus_declared is False
        assert [g["model"] for g in host.gpus] == [H100, H100]


# One thread's plan: (model, count, hold in ms) per workspace it creates then destroys.
operations = st.tuples(st.sampled_from(["A10", "H100"]), st.integers(1, 3), st.integers(0, 3))
plans = st.lists(st.lists(operations, min_size=1, max_size=4), min_size=2, max_size=4)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plans=plans)
def test_assignments_never_overlap_under_concurrent_create_and_destroy(
    ctx: Context, plans: list[list[tuple[str, int, int]]]
) -> None:
    with ctx.session() as session:
        host = session.scalar(select(Host).where(Host.name == "concurrent"))
        if host is None:
            host = Host(
                name="concurrent",
                docker_url="ssh://x@y",
                gpus=[{"index": i, "model": A10 if i < 4 else H100} for i in range(7)],
            )
            session.add(host)
            session.flush()
        host_id = host.id

    holders: dict[int, str] = {}  # device index -> workspace name, as the threads see it
    guard = threading.Lock()
    violations: list[str] = []
    errors: list[BaseException] = []
    served = [0]

    def run(plan: list[tuple[str, int, int]]) -> None:
        try:
            for model, count, hold_ms in plan:
                with ctx.session() as session:
                    host = session.get(Host, host_id)
                    assert host is not None
                    workspace = make_workspace(session)
                    got = gpu_allocation.allocate(session, host, workspace, count, model)
                    workspace.status = (
                        WorkspaceStatus.RUNNING if got is not None else WorkspaceStatus.PENDING
                    )
                    name, workspace_id = workspace.name, workspace.id
                if got is None:
                    continue
                indexes = [a.device_index for a in got]
                with guard:
                    served[0] += 1
                    for index in indexes:
                        if index in holders:
                            violations.append(f"GPU {index}: {holders[index]} and {name}")
                        holders[index] = name
                time.sleep(hold_ms / 1000)
                with guard:
                    for index in indexes:
                        if holders.get(index) == name:
                            del holders[index]
                with ctx.session() as session:
                    held = session.get(Workspace, workspace_id)
                    assert held is not None
                    assert sorted(gpu_allocation.release(session, held)) == sorted(indexes)
                    held.status = WorkspaceStatus.DESTROYED
        except BaseException as exc:  # reported to the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(plan,)) for plan in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "an allocator hung"
    assert not errors, errors
    assert not violations, violations
    assert served[0] >= 1  # at least the first allocation of some thread found free GPUs
    assert [row for row in live_rows(ctx) if row[0] == host_id] == []
