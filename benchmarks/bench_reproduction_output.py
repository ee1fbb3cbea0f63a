"""What a reproduction printing ``--gib`` GiB (default 1) leaves on the portal's disk.

A snapshot whose reproduce.sh prints that much is reproduced in a real Docker workspace the way
the scheduler does it (`scoring.reproduction.reproduce_in_workspace`, its output written to the
live log file of `baseline.grading.reproductions` as it arrives); a thread samples the live
file's size every 10 ms. Printed: the bytes the script printed (the baseline: what a log with
no cap would hold), the live file's largest size, the stored log's size, and their ratios.
Goal: under 10 MB on the portal's disk for 1 GiB printed. Needs the Docker Engine and the test
image (scripts/services/20-docker.sh; run with the environment it writes, .ci-env).

    .venv/bin/python benchmarks/bench_reproduction_output.py [--gib 1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

from baseline.grading.reproductions import _LiveLog
from infra.blobs import BlobStore
from infra.docker_backend import DockerBackend
from infra.hardware import get_profile
from infra.snapshots import capture_directory
from infra.workspace import WorkspaceSpec
from scoring.reproduction import ReproductionOptions, reproduce

GOAL_BYTES = 10 * 1000 * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    args = parser.parse_args()
    image = os.environ.get("BASELINE_TEST_IMAGE")
    if not image:
        raise SystemExit("needs BASELINE_TEST_IMAGE (source .ci-env)")
    printed = int(args.gib * 1024**3)
    labels = {"baseline.test-run": "bench-reproduction-output"}
    backend = DockerBackend.from_url("unix:///var/run/docker.sock", labels=labels)
    with tempfile.TemporaryDirectory(prefix="bench-repro-") as work:
        root = Path(work) / "submission"
        root.mkdir()
        line = "x" * 1023  # 1 KiB lines, as a chatty training loop prints
        (root / "reproduce.sh").write_text(f"yes {line} | head -c {printed}\n")
        store = BlobStore(Path(work) / "blobs")
        digest = capture_directory(root, store).manifest_sha256
        live_path = Path(work) / "reproductions" / "1.log"
        live = _LiveLog(live_path)
        largest = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal largest
            while not done.is_set():
                if live_path.exists():
                    largest = max(largest, live_path.stat().st_size)
                time.sleep(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        spec = WorkspaceSpec(
            name=f"bl-bench-repro-{uuid.uuid4().hex[:8]}",
            image=image,
            profile=get_profile("cpu")[0],
            labels={"baseline.purpose": "reproduction"},
        )
        started = time.monotonic()
        try:
            result = reproduce(
                backend, spec, store, digest, ReproductionOptions(timeout_s=1800), live.write
            )
        finally:
            done.set()
            sampler.join()
            live.close()
            backend.close()
        seconds = time.monotonic() - started
        stored = len(store.get_bytes(result.log_sha256))
        print(f"reproduce.sh printed {result.log_bytes_total:,} bytes in {seconds:.0f} s")
        print(f"  live log file, largest: {largest:>12,} bytes ({largest / printed:.5f}x)")
        print(f"  stored log:             {stored:>12,} bytes ({stored / printed:.5f}x)")
        kept = largest + stored
        verdict = "under" if kept < GOAL_BYTES else "OVER"
        print(f"  on the portal's disk at most {kept:,} bytes: {verdict} the 10 MB goal")


if __name__ == "__main__":
    main()
