"""Peak memory of capturing a directory with very many long names, against holding its listing.

A participant decides how many names a directory holds. A folder of ``--names`` empty files
(default 200,000) with 250-byte names is captured with `capture_directory`, which lists a
directory in sorted runs of `LISTING_RUN_NAMES` spilled to a temporary file; the baseline, in the
same run, is the same capture listing each directory as the walk did before (`os.listdir`, every
name encoded, sorted: all held at once). Each case runs in a fresh child process; printed is its
peak resident set (VmHWM) over its size just before the capture.

    .venv/bin/python benchmarks/bench_listing_memory.py [--names 200000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from infra.blobs import BlobStore
from infra.snapshots import capture_directory, directory_capture

NAME_BYTES = 250


def rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def held_whole(fd: int) -> Iterator[bytes]:
    """The listing as it was made before: the whole directory in memory."""
    return iter(sorted(os.fsencode(name) for name in os.listdir(fd)))


def child(root: Path, store: Path, mode: str) -> None:
    """One capture in this process; prints its peak over the size before it."""
    if mode == "before":
        directory_capture._listing = held_whole
    before = rss_mib("VmRSS")
    result = capture_directory(root, BlobStore(store))
    print(f"{rss_mib('VmHWM') - before:.1f} {result.file_count}")


def measure(root: Path, work: Path, mode: str) -> tuple[float, int]:
    store = Path(tempfile.mkdtemp(dir=work))
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(root), str(store), mode],
        capture_output=True,
        text=True,
        check=True,
    )
    peak, files = done.stdout.split()
    return float(peak), int(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=200_000)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(Path(args.child[0]), Path(args.child[1]), args.child[2])
        return
    with tempfile.TemporaryDirectory(prefix="bench-listing-") as work:
        root = Path(work) / "submission" / "many"
        root.mkdir(parents=True)
        for index in range(args.names):
            name = f"{index:08d}-".ljust(NAME_BYTES, "n")
            os.close(os.open(root / name, os.O_CREAT | os.O_WRONLY, 0o644))
        held, files_held = measure(root.parent, Path(work), "before")
        runs, files_runs = measure(root.parent, Path(work), "now")
        assert files_held == files_runs == args.names, (files_held, files_runs)
        print(f"{args.names} names of {NAME_BYTES} bytes in one directory: peak over idle size")
        print(f"  listing held whole (before):        {held:8.1f} MiB")
        print(f"  sorted runs of {directory_capture.LISTING_RUN_NAMES} (now):      {runs:8.1f} MiB")
        print(f"  ratio now/before: {runs / held:.3f}")


if __name__ == "__main__":
    main()
