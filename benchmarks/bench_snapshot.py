"""Snapshot capture time and storage against `tar czf`, on a generated tree.

A tree of 20,000 files and 1 GiB of random bytes (random data compresses badly, which favours
neither side much) is checkpointed 7 times; between checkpoints 1% of the files are rewritten.
Each checkpoint is captured incrementally from the directory (unchanged files keep their hashes,
recognised by inode, size, mtime and ctime) and, for comparison, tarred with `tar czf` of the
whole tree. Printed: time per capture against time per tarball (goal <= 0.1x) and the blob store's
size against the 7 tarballs' (goal <= 0.2x). Everything lives in a temporary folder, removed at
the end.

    .venv/bin/python benchmarks/bench_snapshot.py [--files 20000] [--mib 1024] [--checkpoints 7]

Two scale cases measure time and peak memory (resident set high-water mark, reset per phase):

- ``--case many-files [--files 100000]``: that many small files (100 bytes each, 1,000 per
  folder), captured first in full, then incrementally with nothing changed (reading the first
  manifest part by part); also the manifest's size and parts. What a participant's dataset of
  tiny files costs the orchestrator: a capture spools its entries to disk, so memory stays flat.
- ``--case sparse-tar [--gib 50]``: a tar stream as an engine sends it for a workspace holding
  one sparse file of that size and one small file, generated lazily (zeros are never stored) and
  captured through the tar source: the big file is refused from its header and its content
  passed over in fixed-size reads, so memory stays flat whatever the size.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from infra.blobs import BlobStore
from infra.snapshots import (
    ChunkReader,
    Limits,
    Manifest,
    capture_archive,
    capture_directory,
)

T = TypeVar("T")


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


def peak_rss_mib() -> float:
    """This process's resident set high-water mark since the last `reset_peak_rss`."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: reset the high-water mark


def measured(what: str, run: Callable[[], T]) -> T:
    reset_peak_rss()
    t = time.perf_counter()
    result = run()
    print(f"{what:<34} {time.perf_counter() - t:8.2f}s  peak RSS {peak_rss_mib():8.1f} MiB")
    return result


def many_files(files: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-many-"))
    try:
        tree = work / "submission"
        t = time.perf_counter()
        for index in range(files):
            folder = tree / f"d{index // 1000:04}"
            if index % 1000 == 0:
                folder.mkdir(parents=True)
            (folder / f"f{index:06}.txt").write_bytes(f"{index:>99}\n".encode())
        print(f"generated {files} files in {time.perf_counter() - t:.1f}s")
        store = BlobStore(work / "blobs")
        first = measured("first capture", lambda: capture_directory(tree, store))
        second = measured(
            "incremental capture (no change)",
            lambda: capture_directory(tree, store, previous=first.manifest_sha256),
        )
        head = Manifest.model_validate_json(store.get_bytes(second.manifest_sha256))
        size = sum(store.path(d).stat().st_size for d in [second.manifest_sha256, *head.parts])
        print(f"files kept {second.file_count}, hashes reused {second.reused_hashes}")
        print(f"manifest {size / 2**20:.1f} MiB in {len(head.parts)} parts")
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.PAX_FORMAT)


def sparse_tar_stream(gib: int) -> Iterator[bytes]:
    """What an engine sends for /home/submission holding `gib` GiB of sparse file and a note."""
    size = gib << 30
    yield _tar_header("submission/huge.bin", size)
    zeros = bytes(1 << 20)
    left = size
    while left > 0:
        yield zeros[: min(left, len(zeros))]
        left -= len(zeros)
    note = b"small file after the big one\n"
    yield _tar_header("submission/note.txt", len(note))
    yield note + bytes(-len(note) % tarfile.BLOCKSIZE)
    yield bytes(2 * tarfile.BLOCKSIZE)


def sparse_tar(gib: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-sparse-"))
    try:
        store = BlobStore(work / "blobs")

        def fetch() -> io.BufferedReader:
            return io.BufferedReader(ChunkReader(sparse_tar_stream(gib)), 1 << 20)

        result = measured(
            f"tar source, {gib} GiB sparse file", lambda: capture_archive(fetch, store)
        )
        reasons = {s.path: s.reason for s in result.manifest.skipped}
        print(f"kept {[e.path for e in result.manifest.entries]}, skipped {reasons}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--case", choices=["tarball", "many-files", "sparse-tar"], default="tarball"
    )
    parser.add_argument("--gib", type=int, default=50, help="sparse-tar: size of the big file")
    parser.add_argument("--files", type=int, default=None)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--checkpoints", type=int, default=7)
    parser.add_argument("--changed", type=float, default=0.01, help="fraction rewritten each time")
    args = parser.parse_args()
    if args.case == "many-files":
        many_files(args.files or 100_000)
        return
    if args.case == "sparse-tar":
        sparse_tar(args.gib)
        return
    args.files = args.files or 20_000

    rng = random.Random(42)
    work = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    try:
        tree = work / "submission"
        t = time.perf_counter()
        paths = make_tree(tree, args.files, args.mib * 1024 * 1024, rng)
        print(f"generated {args.files} files, {args.mib} MiB in {time.perf_counter() - t:.1f}s")
        store = BlobStore(work / "blobs")
        limits = Limits()
        previous: str | None = None
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
            previous = result.manifest_sha256
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
