"""Workspace benchmark on the real dockerd: create-to-ready time and idle capacity of one host.

1. Create-to-ready: `create` + `start` (which includes `git init` of the submission) of a cpu
   workspace, median of 20, against a plain `docker run` of the same image measured in the same
   run (the ratio is the cost of our limits, volumes, labels and repository initialisation).
2. Capacity: idle cpu workspaces started one after another on this host until a cap (100) or
   until the host's available memory drops under a floor; the count and the memory each idle
   workspace costs are printed. Everything created is labelled and removed at the end.

Usage: .venv/bin/python benchmarks/bench_workspace.py [--runs 20] [--cap 100] [--ssh URL]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import docker

from infra.docker_backend import DockerBackend
from infra.hardware import get_profile
from infra.image_build import build_workspace_image
from infra.workspace import WorkspaceHandle, WorkspaceSpec

LOCAL = "unix:///var/run/docker.sock"
MEMORY_FLOOR_MIB = 2048


def mem_available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def plain_run_s(client: docker.DockerClient, image: str, labels: dict[str, str]) -> float:
    started = time.perf_counter()
    container = client.containers.run(image, ["true"], detach=True, labels=labels)
    container.wait()
    elapsed = time.perf_counter() - started
    container.remove(force=True)
    return elapsed


def create_to_ready(backend: DockerBackend, image: str, runs: int) -> list[float]:
    profile = get_profile("cpu")[0]
    times: list[float] = []
    for _ in range(runs):
        spec = WorkspaceSpec(name=f"bench-{uuid.uuid4().hex[:10]}", image=image, profile=profile)
        started = time.perf_counter()
        handle = backend.create(spec)
        try:
            backend.start(handle)
            times.append(time.perf_counter() - started)
        finally:
            backend.destroy(handle)
    return times


def capacity(backend: DockerBackend, image: str, cap: int) -> tuple[int, float, str]:
    profile = get_profile("cpu")[0]
    handles: list[WorkspaceHandle] = []
    before = mem_available_mib()
    reason = f"cap of {cap} reached"
    try:
        while len(handles) < cap:
            if mem_available_mib() < MEMORY_FLOOR_MIB:
                reason = f"available memory under {MEMORY_FLOOR_MIB} MiB"
                break
            spec = WorkspaceSpec(
                name=f"bench-{uuid.uuid4().hex[:10]}", image=image, profile=profile
            )
            handle = backend.create(spec)
            handles.append(handle)
            backend.start(handle)
        time.sleep(2)  # let the idle processes settle before reading memory
        per_workspace = (before - mem_available_mib()) / max(len(handles), 1)
        alive = sum(1 for h in handles if backend.status(h).value == "running")
        if alive != len(handles):
            reason += f"; only {alive} of {len(handles)} still running"
        return alive, per_workspace, reason
    finally:
        for handle in handles:
            backend.destroy(handle)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--cap", type=int, default=100)
    parser.add_argument("--ssh", help="also time create-to-ready over this ssh:// URL (5 runs)")
    args = parser.parse_args()
    labels = {"baseline.bench": uuid.uuid4().hex[:12]}
    backend = DockerBackend.from_url(LOCAL, labels=labels)
    image = build_workspace_image(backend.client, "cpu").tag
    info = backend.client.info()
    print(
        f"host: {info['NCPU']} CPUs, {info['MemTotal'] // 2**20} MiB, docker "
        f"{info['ServerVersion']}; image {image}"
    )

    plain = [plain_run_s(backend.client, image, labels) for _ in range(args.runs)]
    ready = create_to_ready(backend, image, args.runs)
    plain_median, ready_median = statistics.median(plain), statistics.median(ready)
    print(f"plain docker run (baseline): median {plain_median * 1000:.0f} ms over {args.runs}")
    print(
        f"workspace create-to-ready: median {ready_median * 1000:.0f} ms, "
        f"min {min(ready) * 1000:.0f}, max {max(ready) * 1000:.0f} over {args.runs}; "
        f"ratio to plain run {ready_median / plain_median:.2f}x"
    )
    if args.ssh:
        remote = DockerBackend.from_url(args.ssh, labels=labels)
        over_ssh = create_to_ready(remote, image, 5)
        remote.close()
        print(
            f"workspace create-to-ready over {args.ssh}: median "
            f"{statistics.median(over_ssh) * 1000:.0f} ms over 5; ratio to local "
            f"{statistics.median(over_ssh) / ready_median:.2f}x"
        )

    started = time.perf_counter()
    count, per_mib, reason = capacity(backend, image, args.cap)
    print(
        f"idle workspaces on this host: {count} ({reason}); about {per_mib:.1f} MiB each; "
        f"filled and emptied in {time.perf_counter() - started:.0f} s"
    )
    leftovers = backend.client.containers.list(
        all=True, filters={"label": f"baseline.bench={labels['baseline.bench']}"}
    )
    backend.close()
    if leftovers:
        print(f"error: {len(leftovers)} benchmark containers left behind", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
