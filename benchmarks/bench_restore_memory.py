"""Peak memory of restoring a snapshot into a workspace, against holding its tar in memory.

A snapshot of ``--mib`` MiB (default 400: 50 files of random bytes) is captured into a blob store,
then restored the way a reproduction restores it: the tar written with the workspace user as
owner and handed to the backend's ``put_archive``; and the way a script scoring does (the export,
then every member re-owned on the way). The backend here is a sink that reads what it is given in
64 KiB blocks and discards it, as the Docker SDK's HTTP client sends a file body; the engine's
side of the copy is another process and not counted.

The baseline, measured in the same run, is what both paths did before: the whole tar built in
memory (``io.BytesIO``), then a re-owned copy of it, also in memory. Each case runs in a fresh
child process; printed is its peak resident set (VmHWM) over its size just before the restore.
Goal: the restore peaks under 150 MiB over the idle size (it was 764 MiB for 400 MB).

    .venv/bin/python benchmarks/bench_restore_memory.py [--mib 400]
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import BinaryIO

from infra.blobs import BlobStore
from infra.snapshots import (
    EXPORT_ROOT,
    Limits,
    capture_directory,
    export_tar,
    load_manifest,
    tar_file,
)
from scoring.scoring_run import owned_tar

GOAL_MIB = 150.0
FILE_MIB = 8
UID = GID = 1000


def rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def drain(archive: bytes | BinaryIO) -> int:
    """What the sink backend does with an archive: read it in blocks, keep nothing."""
    if isinstance(archive, bytes):
        return len(archive)
    total = 0
    while block := archive.read(64 * 1024):
        total += len(block)
    return total


def in_memory(store: BlobStore, digest: str) -> int:
    """Before: the tar held whole, then a re-owned copy of it held whole too."""
    buffer = io.BytesIO()
    export_tar(store, load_manifest(store, digest), buffer, gzip=False, root=EXPORT_ROOT)
    tar = buffer.getvalue()
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as source,
        tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target,
    ):
        for member in source:
            member.uid, member.gid = UID, GID
            target.addfile(member, source.extractfile(member) if member.isfile() else None)
    return drain(out.getvalue())


def reproduction(store: BlobStore, digest: str) -> int:
    with tar_file(store, load_manifest(store, digest), owner=(UID, GID)) as archive:
        return drain(archive)


def scoring(store: BlobStore, digest: str) -> int:
    with (
        tar_file(store, load_manifest(store, digest)) as archive,
        owned_tar(archive, UID, GID) as owned,
    ):
        return drain(owned)


CASES = {"in memory (before)": in_memory, "reproduction": reproduction, "scoring": scoring}


def child(case: str, blobs: str, digest: str) -> None:
    store = BlobStore(Path(blobs))
    Path("/proc/self/clear_refs").write_text("5")  # Linux: reset the high-water mark
    idle = rss_mib("VmRSS")
    sent = CASES[case](store, digest)
    print(f"{rss_mib('VmHWM') - idle:.1f} {sent}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=400)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        tree, store = Path(tmp) / "tree", BlobStore(Path(tmp) / "blobs")
        tree.mkdir()
        for index in range(max(1, args.mib // FILE_MIB)):
            (tree / f"data-{index:03d}.bin").write_bytes(os.urandom(FILE_MIB * 1024 * 1024))
        limits = Limits(max_file_bytes=(FILE_MIB + 1) * 1024 * 1024)
        digest = capture_directory(tree, store, limits).manifest_sha256
        print(f"snapshot: {args.mib} MiB in {args.mib // FILE_MIB} files")
        peaks: dict[str, float] = {}
        for case in CASES:
            run = subprocess.run(
                [sys.executable, __file__, "--child", case, str(store.root), digest],
                capture_output=True,
                text=True,
                check=True,
            )
            peak, sent = run.stdout.split()
            peaks[case] = float(peak)
            print(f"{case:>20}: peak {peaks[case]:7.1f} MiB over idle ({int(sent) >> 20} MiB sent)")
    baseline = peaks["in memory (before)"]
    for case in ("reproduction", "scoring"):
        verdict = "ok" if peaks[case] < GOAL_MIB else "OVER THE GOAL"
        print(
            f"{case}: {peaks[case] / baseline:.3f}x the in-memory peak; "
            f"goal < {GOAL_MIB:.0f} MiB over idle: {verdict}"
        )
    if any(peaks[case] >= GOAL_MIB for case in ("reproduction", "scoring")):
        sys.exit(1)


if __name__ == "__main__":
    main()
