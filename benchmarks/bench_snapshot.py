"""Snapshot capture time and storage against `tar czf`, on a generated tree.

A tree of 20,000 files and 1 GiB of random bytes (random data compresses badly, which favours
neither side much) is checkpointed 7 times; between checkpoints 1% of the files are rewritten.
Each checkpoint is captured incrementally from the directory (unchanged files keep their hashes,
recognised by inode, size, mtime and ctime) and, for comparison, tarred with `tar czf` of the
whole tree. Printed: time per capture against time per tarball (goal <= 0.1x) and the blob store's
size against the 7 tarballs' (goal <= 0.2x). Everything lives in a temporary folder, removed at
the end.

    .venv/bin/python benchmarks/bench_snapshot.py [--files 20000] [--mib 1024] [--checkpoints 7]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from infra.blobs import BlobStore
from infra.snapshots import Limits, Manifest, capture_directory


def make_tree(root: Path, files: int, total_bytes: int, rng: random.Random) -> list[Path]:
    size = total_bytes // files
    paths = []
    for index in range(files):
        folder = root / f"d{index // 500:03}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"f{index:05}.bin"
        path.write_bytes(rng.randbytes(size))
        paths.append(path)
    return paths


def tar_czf(root: Path) -> tuple[float, int]:
    """Seconds and bytes of `tar czf - .` of the whole tree (streamed, not stored)."""
    started = time.perf_counter()
    process = subprocess.Popen(["tar", "czf", "-", "-C", str(root), "."], stdout=subprocess.PIPE)
    assert process.stdout is not None
    size = 0
    while chunk := process.stdout.read(1 << 20):
        size += len(chunk)
    if process.wait() != 0:
        raise SystemExit("tar czf failed")
    return time.perf_counter() - started, size


def store_bytes(root: Path) -> int:
    total = 0
    for folder, _dirs, names in os.walk(root):
        if Path(folder).name == "tmp":
            continue
        total += sum(os.lstat(os.path.join(folder, n)).st_size for n in names)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--checkpoints", type=int, default=7)
    parser.add_argument("--changed", type=float, default=0.01, help="fraction rewritten each time")
    args = parser.parse_args()

    rng = random.Random(42)
    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    try:
        tree = work / "submission"
        t = time.perf_counter()
        paths = make_tree(tree, args.files, args.mib * 1024 * 1024, rng)
        print(f"generated {args.files} files, {args.mib} MiB in {time.perf_counter() - t:.1f}s")
        store = BlobStore(work / "blobs")
        limits = Limits()
        previous: Manifest | None = None
        capture_times: list[float] = []
        tar_times: list[float] = []
        tar_sizes: list[int] = []
        first_capture = 0.0
        for checkpoint in range(args.checkpoints):
            if checkpoint:
                for path in rng.sample(paths, int(len(paths) * args.changed)):
                    path.write_bytes(rng.randbytes(path.stat().st_size))
            t = time.perf_counter()
            result = capture_directory(tree, store, limits, previous)
            elapsed = time.perf_counter() - t
            previous = result.manifest
            if checkpoint:
                capture_times.append(elapsed)
            else:
                first_capture = elapsed
            seconds, size = tar_czf(tree)
            tar_times.append(seconds)
            tar_sizes.append(size)
            print(
                f"checkpoint {checkpoint + 1}: capture {elapsed:6.2f}s "
                f"({result.reused_hashes} hashes reused, {result.new_blobs} new blobs)  "
                f"tar czf {seconds:6.2f}s {size / 2**20:8.1f} MiB"
            )
        incremental = statistics.median(capture_times) if capture_times else first_capture
        tar_time = statistics.median(tar_times)
        stored = store_bytes(work / "blobs")
        tarballs = sum(tar_sizes)
        print()
        print(f"first (full) capture:         {first_capture:8.2f}s")
        print(f"incremental capture (median): {incremental:8.2f}s")
        print(f"tar czf whole tree (median):  {tar_time:8.2f}s")
        print(f"time ratio capture/tar:       {incremental / tar_time:8.3f}x  (goal <= 0.1x)")
        print(f"blob store after {args.checkpoints}:        {stored / 2**20:8.1f} MiB")
        print(f"{args.checkpoints} tarballs:                  {tarballs / 2**20:8.1f} MiB")
        print(f"storage ratio store/tarballs: {stored / tarballs:8.3f}x  (goal <= 0.2x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
