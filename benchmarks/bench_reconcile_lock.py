"""How long the portal's writes wait while reconcile places pending workspaces (SQLite).

A study launched onto full hosts leaves its workspaces pending; reconcile places them once
there is room, each one an engine call of seconds (longer over SSH) while the placement's claim
holds its row. On SQLite a transaction's first write holds the database's write lock until it
ends. Placing them all in one transaction held every other write of the portal back for the sum
of the placements, and one that waited the busy timeout (30 s) failed. Committing each
placement alone did not help: a waiting writer polls in SQLite's busy handler at growing
intervals (up to 100 ms) and missed the moment between one placement's commit and the next
one's claim (4.04 s both ways, 8 placements of 0.5 s). Now each step that wrote is committed
and followed by a pause of one poll interval (`baseline.db.commit_step`).

Each placement's container takes --create-s seconds to make (an engine stand-in: the time is
what matters here, not a container). While reconcile places --workspaces of them, another
thread writes a row every 20 ms in its own transaction, as the portal's requests do. Printed:
the longest wait of one such write with the commits held to the end (before, emulated) and as
reconcile commits now, and their ratio.

    .venv/bin/python benchmarks/bench_reconcile_lock.py [--workspaces 8] [--create-s 0.5]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from sqlalchemy import update

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from baseline import audit, migrate
from baseline.config import Settings
from baseline.context import Context
from baseline.models import Host, Workspace, WorkspacePurpose, WorkspaceStatus
from baseline.workspaces import workspaces
from infra.workspace import WorkspaceHandle, WorkspaceSpec
from tests.baseline.fake_engine import FakeEngine


class SlowEngine(FakeEngine):
    """Makes each container in `create_s` seconds."""

    create_s: float = 0.0

    def create(self, spec: WorkspaceSpec) -> WorkspaceHandle:
        time.sleep(self.create_s)
        return super().create(spec)


def longest_write_wait(
    ctx: Context, engine: SlowEngine, count: int, *, one_transaction: bool
) -> float:
    with ctx.session() as session:
        host = Host(name=f"engine-{one_transaction}", docker_url="unix:///x.sock", healthy=True)
        session.add(host)
        for index in range(count):
            session.add(
                Workspace(
                    purpose=WorkspacePurpose.ATTEMPT,
                    backend="fake",
                    name=f"ws-{one_transaction}-{index}",
                    image="img",
                    hardware_profile="cpu",
                    network="none",
                    status=WorkspaceStatus.PENDING,
                )
            )
    waits: list[float] = []
    done = threading.Event()

    def writer() -> None:
        while not done.is_set():
            began = time.perf_counter()
            with ctx.session() as session:
                audit.record(session, "bench.write", "host", 0, None)
            waits.append(time.perf_counter() - began)
            time.sleep(0.02)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        with ctx.session() as session:
            commit = session.commit
            if one_transaction:  # the commits held to the scope's end, as before
                session.commit = session.flush  # type: ignore[method-assign]
            report = workspaces.reconcile(session, engine.factory)
            session.commit = commit  # type: ignore[method-assign]
            assert len(report.placed) == count, report
    finally:
        done.set()
        thread.join()
    with ctx.session() as session:  # the next run's workspaces are the only pending ones
        session.execute(
            update(Workspace)
            .where(Workspace.status == WorkspaceStatus.RUNNING)
            .values(status=WorkspaceStatus.DESTROYED)
        )
    return max(waits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspaces", type=int, default=8)
    parser.add_argument("--create-s", type=float, default=0.5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-reconcile-lock-"))
    try:
        url = f"sqlite:///{work / 'bench.db'}"
        migrate.upgrade(url)
        ctx = Context.from_settings(
            Settings(home=work / "home", database_url=url, secret_key="bench")
        )
        engine = SlowEngine(name="fake")
        engine.create_s = args.create_s
        before = longest_write_wait(ctx, engine, args.workspaces, one_transaction=True)
        now = longest_write_wait(ctx, engine, args.workspaces, one_transaction=False)
        print(
            f"{args.workspaces} placements of {args.create_s:.2f} s each; longest wait of a write:"
        )
        print(f"  one transaction per reconcile (before): {before:6.2f} s")
        print(f"  one per placement (now):                {now:6.2f} s")
        print(f"  ratio before / now: {before / now:.1f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
