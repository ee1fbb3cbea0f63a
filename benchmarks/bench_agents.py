"""Agent benchmark on the real dockerd with the local fake model (tests/fake_openai.py).

1. Overhead per tool call: the median wall time of `bash -c true` run (a) with a plain
   `docker exec` (the CLI), (b) through the backend's `exec`, (c) as an agent tool call inside the
   run loop (from the recorded start of the tool call to its recorded result: argument handling,
   the exec as the participant with its time-out, and two transcript writes). The overhead is
   (c) minus (a), and (c) minus (b). Goal: under 50 ms.
2. Concurrency: N agents (default 20) on this machine, each in its own workspace, each taking S
   steps (one `true` tool call a step) against the fake model; the p50 and p99 of a step (model
   call + tool call + transcript writes) are printed.

Everything runs in a temporary home (SQLite, or PostgreSQL with --database-url) and every
workspace is labelled and destroyed at the end.

Usage: .venv/bin/python benchmarks/bench_agents.py [--calls 30] [--agents 20] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import docker
from sqlalchemy import select

from baseline import migrate
from baseline.attempts import launch
from baseline.config import Settings
from baseline.context import Context
from baseline.models import Host, TranscriptEntry, Workspace
from baseline.runs.agent_runs import AgentLoop
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import workspaces
from infra.docker_backend import DockerBackend
from infra.image_build import build_workspace_image
from infra.workspace import WorkspaceBackend
from tests.fake_openai import FakeOpenAI, Reply, ToolCall

LOCAL = "unix:///var/run/docker.sock"
LABELS = {"baseline.bench": uuid.uuid4().hex[:12]}
TRUE = Reply(tool_calls=(ToolCall("bash", {"cmd": "true"}),))
END = Reply(tool_calls=(ToolCall("end_task", {}),))


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=LABELS)


def scripted(count: int) -> Callable[[dict[str, Any]], Reply]:
    """Each agent gets `count` `true` calls (counted in its own conversation), then ends."""

    def answer(body: dict[str, Any]) -> Reply:
        answered = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        return TRUE if answered < count else END

    return answer


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def setup(ctx: Context, image: str, base_url: str, agents: int) -> list[int]:
    """A study with `agents` launched agent attempts on the demo paper task."""
    with ctx.session() as session:
        if not workspaces.list_hosts(session):
            host = workspaces.add_host(session, "local", LOCAL, None)
            host.healthy = True
        name = f"bench {uuid.uuid4().hex[:6]}"
        study = studies.create_study(
            session, studies.StudySpec(name=name, egress_policy="none"), None
        )
        demo = tasks.import_demo_tasks(session, ctx.settings)
        paper = next(t for t in demo if t.slug == "digits-baselines")
        studies.add_task(session, study, paper, None)
        session.flush()
        session.refresh(study)
        prices = {"input_usd_per_mtok": 0.0, "output_usd_per_mtok": 0.0}
        ids = []
        for i in range(agents):
            agent = studies.add_agent(
                session, study, f"bench {i}", "basic", "fake", base_url, prices, None
            )
            ids.append(studies.create_attempt(session, agent, paper, None).id)
    for attempt_id in ids:
        launch.launch(ctx, attempt_id, None, image=image, backend_factory=factory)
    return ids


def tool_call_times(ctx: Context, attempt_id: int) -> list[float]:
    with ctx.session() as session:
        rows = list(
            session.scalars(
                select(TranscriptEntry)
                .where(TranscriptEntry.run.has(attempt_id=attempt_id))
                .order_by(TranscriptEntry.seq)
            )
        )
    starts = {r.tool_call_id: r.started_at for r in rows if r.kind == "tool_start"}
    return [
        (r.ended_at - starts[r.tool_call_id]).total_seconds()
        for r in rows
        if r.role == "tool" and r.tool_name == "bash" and r.tool_call_id in starts
    ]


def step_times(ctx: Context, attempt_id: int) -> list[float]:
    """From each model call's start to the recorded result of its tool call."""
    with ctx.session() as session:
        rows = list(
            session.scalars(
                select(TranscriptEntry)
                .where(TranscriptEntry.run.has(attempt_id=attempt_id))
                .order_by(TranscriptEntry.seq)
            )
        )
    times, asked = [], None
    for row in rows:
        if row.role == "assistant":
            asked = row.started_at
        elif row.role == "tool" and row.tool_name == "bash" and asked is not None:
            times.append((row.ended_at - asked).total_seconds())
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--database-url", help="default: SQLite in a temporary home")
    args = parser.parse_args()

    client = docker.DockerClient(base_url=LOCAL, use_ssh_client=False)
    image = build_workspace_image(client, "cpu").tag
    client.close()
    home = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    url = args.database_url or f"sqlite:///{home / 'bench.db'}"
    migrate.upgrade(url)
    ctx = Context.from_settings(Settings(home=home, database_url=url, secret_key="bench"))
    try:
        with FakeOpenAI(answer=scripted(args.calls)) as server:
            (single,) = setup(ctx, image, server.base_url, 1)
            with ctx.session() as session:
                row = session.scalars(select(Workspace).where(Workspace.attempt_id == single)).one()
                handle = workspaces.handle_of(row)
            backend = DockerBackend.from_url(LOCAL, labels=LABELS)
            plain, sdk = [], []
            for _ in range(args.calls):
                started = time.perf_counter()
                subprocess.run(
                    ["docker", "exec", "-u", "participant", "-w", "/home/submission",
                     handle.name, "bash", "-c", "true"], check=True,
                )  # fmt: skip
                plain.append(time.perf_counter() - started)
                started = time.perf_counter()
                backend.exec(handle, ["bash", "-c", "true"], timeout_s=60, user="participant")
                sdk.append(time.perf_counter() - started)
            backend.close()
            AgentLoop(ctx, single, backend_factory=factory).run()
            tools = tool_call_times(ctx, single)
        plain_ms = statistics.median(plain) * 1000
        print(f"plain `docker exec` (CLI), median of {len(plain)}: {plain_ms:.1f} ms")
        print(f"backend exec (SDK), median of {len(sdk)}: {statistics.median(sdk) * 1000:.1f} ms")
        tool_ms = statistics.median(tools) * 1000
        sdk_ms = statistics.median(sdk) * 1000
        print(f"agent tool call in the loop, median of {len(tools)}: {tool_ms:.1f} ms")
        print(f"overhead per tool call beyond plain docker exec: {tool_ms - plain_ms:+.1f} ms")
        print(f"overhead per tool call beyond the backend's own exec: {tool_ms - sdk_ms:+.1f} ms")

        if args.agents > 0:
            with FakeOpenAI(answer=scripted(args.steps)) as server:
                ids = setup(ctx, image, server.base_url, args.agents)
                errors: list[str] = []

                def drive(attempt_id: int) -> None:
                    try:
                        AgentLoop(ctx, attempt_id, backend_factory=factory).run()
                    except Exception as exc:  # reported below, the others go on
                        errors.append(f"attempt {attempt_id}: {exc}")

                threads = [threading.Thread(target=drive, args=(i,)) for i in ids]
                started = time.perf_counter()
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                wall = time.perf_counter() - started
            times = [t for i in ids for t in step_times(ctx, i)]
            print(
                f"{args.agents} concurrent agents x {args.steps} steps in {wall:.1f} s: "
                f"{len(times)} steps, p50 {percentile(times, 0.5) * 1000:.0f} ms, "
                f"p99 {percentile(times, 0.99) * 1000:.0f} ms, errors {len(errors)}"
            )
            for error in errors[:5]:
                print("  " + error)
    finally:
        with ctx.session() as session:
            for workspace in workspaces.live_workspaces(session):
                workspaces.destroy(session, workspace, factory)
        ctx.engine.dispose()


if __name__ == "__main__":
    main()
