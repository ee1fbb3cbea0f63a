"""Incremental capture on a remote (ssh://) host against the full tar stream, in one run.

A submission volume on the host gets a tree of 20,000 files (random bytes, 1,000 per folder) and
is captured once into a blob store. Then 1% of the files are rewritten, and the same state is
captured both ways, alternately, `--rounds` times into copies of that store:

- incremental: a helper container scans the volume on the host against the first capture's
  manifest (files with the same stat key are not read), hashes the rest, and only the changed
  files come over (`infra.remote_capture.capture_volume`), what remote workspaces now use;
- full tar: the engine streams the whole tree over SSH and every file is hashed here
  (`infra.snapshots.capture_archive`), what remote workspaces used before.

Printed: the median time of each and their ratio (goal <= 0.2x). Everything it makes on the host
(volume, containers) carries a run label and is removed at the end.

    BASELINE_TEST_SSH_URL=ssh://root@127.0.0.1:52222 BASELINE_TEST_IMAGE=baseline-workspace:... \\
      .venv/bin/python benchmarks/bench_remote_snapshot.py [--files 20000] [--kib 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import cast

from infra.blobs import BlobStore
from infra.docker_backend import DockerBackend
from infra.remote_capture import capture_volume
from infra.snapshots import archive_reader, capture_archive
from infra.workspace import WorkspaceHandle

FILL = r"""
import os, sys
root, files, size, seed = "/s", int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for i in range(files):
    folder = f"{root}/d{i // 1000:03d}"
    os.makedirs(folder, exist_ok=True)
    with open(f"{folder}/f{i:05d}.bin", "wb") as f:
        f.write(os.urandom(size))
"""

CHANGE = r"""
import os, sys
files, every, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for i in range(0, files, every):
    with open(f"/s/d{i // 1000:03d}/f{i:05d}.bin", "wb") as f:
        f.write(os.urandom(size))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("BASELINE_TEST_SSH_URL"))
    parser.add_argument("--image", default=os.environ.get("BASELINE_TEST_IMAGE"))
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--kib", type=int, default=4)
    parser.add_argument("--changed-percent", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not args.url or not args.image:
        parser.error("--url (ssh://...) and --image are needed (or the BASELINE_TEST_* variables)")
    run = uuid.uuid4().hex[:8]
    labels = {"baseline.bench-run": run}
    backend = DockerBackend.from_url(args.url, labels=labels)
    volume = f"bl-bench-{run}"
    client = backend.client
    client.volumes.create(volume, labels=labels)
    work = Path(tempfile.mkdtemp(prefix="bl-bench-"))
    holder = None
    try:

        def in_volume(script: str, *argv: str) -> None:
            client.containers.run(
                args.image,
                ["python3", "-c", script, *argv],
                entrypoint=[],
                user="0",
                remove=True,
                network_mode="none",
                volumes={volume: {"bind": "/s", "mode": "rw"}},
                labels=labels,
            )

        size = args.kib * 1024
        in_volume(FILL, str(args.files), str(size), run)
        # The full tar is read through a container, as a live workspace's is.
        holder = client.containers.run(
            args.image,
            ["sleep", "3600"],
            entrypoint=[],
            detach=True,
            network_mode="none",
            volumes={volume: {"bind": "/home/submission", "mode": "ro"}},
            labels=labels,
        )
        handle = WorkspaceHandle(
            name=cast(str, holder.name),
            backend="docker",
            container_id=cast(str, holder.id),
            image_digest=None,
            submission_volume=volume,
        )
        base = BlobStore(work / "base")
        started = time.monotonic()
        first = capture_volume(backend, args.image, volume, base)
        print(
            f"first capture: {first.file_count} files, {first.manifest.total_bytes / 2**20:.0f} "
            f"MiB in {time.monotonic() - started:.1f} s"
        )
        every = max(1, round(100 / args.changed_percent))
        in_volume(CHANGE, str(args.files), str(every), str(size))
        incremental: list[float] = []
        full: list[float] = []
        for index in range(args.rounds):
            for kind in ("incremental", "full"):
                store_dir = work / f"{kind}-{index}"
                # Blobs are read-only once written: hard links make each round's store cheaply.
                shutil.copytree(work / "base", store_dir, copy_function=os.link)
                store = BlobStore(store_dir)
                started = time.monotonic()
                if kind == "incremental":
                    result = capture_volume(
                        backend, args.image, volume, store, previous=first.manifest_sha256
                    )
                    incremental.append(time.monotonic() - started)
                else:
                    result = capture_archive(
                        lambda: archive_reader(backend, handle, "/home/submission"),
                        store,
                        root="submission",
                    )
                    full.append(time.monotonic() - started)
                print(
                    f"round {index + 1} {kind}: {time.monotonic() - started:.2f} s, "
                    f"{result.file_count} files, {result.new_blobs} new blobs, "
                    f"{result.reused_hashes} hashes reused"
                )
                shutil.rmtree(store_dir)
        inc, tar = statistics.median(incremental), statistics.median(full)
        print(f"incremental (helper on the host): median {inc:.2f} s")
        print(f"full tar stream over ssh:         median {tar:.2f} s")
        print(f"ratio: {inc / tar:.3f}x (goal <= 0.2x); load average {os.getloadavg()}")
    finally:
        if holder is not None:
            holder.remove(force=True)
        backend.remove_helpers(volume)  # the volume's long-lived capture helper
        client.volumes.get(volume).remove(force=True)
        backend.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
