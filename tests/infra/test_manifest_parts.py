"""A capture's memory does not grow with the number of files: the manifest is spooled to disk
while the tree is read and stored in parts (issue 15, item 4).

The tree is a tar stream generated lazily (20,000 tiny files with one content, so the store
holds one file blob and the test stays fast); before parts, the capture held every entry as an
object and the whole manifest as one JSON text: 51 MiB more at this size, 15 MiB since.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.blobs import BlobStore
from infra.snapshots import (
    ChunkReader,
    Manifest,
    capture_directory,
    capture_tar,
    count_files,
    diff,
    export_tar,
    iter_entries,
    load_manifest,
    verify,
)
from infra.snapshots.collector import PART_ENTRIES

MIB = 1 << 20
FILES = 20_000


def _rss_high_water() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def _reset_rss_high_water() -> int:
    """Reset this process's resident-set high-water mark (Linux); the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")
    return _rss_high_water()


def _many_files(count: int) -> Iterator[bytes]:
    """A tar stream of `count` one-byte files under submission/, 500 per folder."""
    for index in range(count):
        info = tarfile.TarInfo(f"submission/d{index // 500:04}/file-{index:06}.txt")
        info.size, info.mtime = 1, 1_700_000_000
        yield info.tobuf(format=tarfile.GNU_FORMAT) + b"x" + bytes(tarfile.BLOCKSIZE - 1)
    yield bytes(2 * tarfile.BLOCKSIZE)


def test_a_capture_of_many_files_holds_bounded_memory_and_stores_its_manifest_in_parts(
    tmp_path: Path,
) -> None:
    store = BlobStore(tmp_path / "blobs")
    stream = io.BufferedReader(ChunkReader(_many_files(FILES)), MIB)
    before = _reset_rss_high_water()
    result = capture_tar(stream, store)
    grown = _rss_high_water() - before
    assert grown < 32 * MIB, f"capture of {FILES} files grew the process by {grown / MIB:.0f} MiB"
    assert (result.file_count, result.total_bytes, result.new_blobs) == (
        FILES,
        FILES,
        1 + -(-FILES // PART_ENTRIES) + 1,  # the content, the parts, the manifest
    )
    head = Manifest.model_validate_json(store.get_bytes(result.manifest_sha256))
    assert head.entries == [] and len(head.parts) == -(-FILES // PART_ENTRIES)
    assert store.path(result.manifest_sha256).stat().st_size < 64 * 1024  # the head stays small

    # readers see one whole manifest, in key order, whatever its parts
    keys = [e.key for e in iter_entries(store, result.manifest_sha256)]
    assert keys == sorted(keys) and len(keys) == FILES
    assert count_files(store, result.manifest_sha256) == FILES
    assert verify(store, result.manifest_sha256) == []


def test_parted_manifest_reads_back_for_diff_export_verify_and_incremental_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import infra.snapshots.collector as collector

    monkeypatch.setattr(collector, "PART_ENTRIES", 3)  # several parts from a handful of files
    store = BlobStore(tmp_path / "blobs")
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    for index in range(7):
        (tree / "src" / f"f{index}.py").write_text(f"print({index})\n")
    first = capture_directory(tree, store)
    manifest = load_manifest(store, first.manifest_sha256)
    assert len(manifest.parts) == 3 and len(manifest.files) == 7
    (tree / "src" / "f3.py").write_text("changed\n")
    (tree / "src" / "f0.py").unlink()
    second = capture_directory(tree, store, previous=first.manifest_sha256)
    assert second.reused_hashes == 5  # unchanged files known from the parts of the first
    changes = diff(manifest, load_manifest(store, second.manifest_sha256))
    assert (changes.added, changes.removed, changes.changed) == ([], ["src/f0.py"], ["src/f3.py"])
    out = io.BytesIO()
    export_tar(store, load_manifest(store, second.manifest_sha256), out)
    out.seek(0)
    with tarfile.open(fileobj=out) as archive:
        names = archive.getnames()
    assert names == ["submission", "submission/src"] + [
        f"submission/src/f{i}.py" for i in range(1, 7)
    ]
    # a missing part is reported, not read past
    store.path(manifest.parts[1]).unlink()
    problems = verify(store, first.manifest_sha256)
    assert [p.detail for p in problems] == [f"part {manifest.parts[1]} is missing or corrupt"]


def test_listing_capture_fetches_spooled_files_and_records_those_gone(tmp_path: Path) -> None:
    """The files a listing capture still has to fetch wait in its spool, not in memory."""
    import base64
    import hashlib

    from infra.snapshots import Listed, capture_listing

    store = BlobStore(tmp_path / "blobs")
    known = store.put_bytes(b"already stored")

    def listed(name: bytes, data: bytes) -> Listed:
        digest = hashlib.sha256(data).hexdigest()
        return Listed(
            raw=base64.b64encode(name).decode(), kind="file", size=len(data), sha256=digest
        )

    listing = [listed(b"kept", b"already stored"), listed(b"new", b"v1"), listed(b"gone", b"x")]
    asked: list[list[bytes]] = []

    def fetch(paths: list[bytes]) -> Iterator[io.BytesIO]:
        asked.append(paths)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo("new")
            info.size = 2
            archive.addfile(info, io.BytesIO(b"v2"))  # rewritten since it was listed
        buffer.seek(0)
        yield buffer

    result = capture_listing(listing, fetch, store)
    assert asked == [[b"gone", b"new"]] and result.reused_hashes == 1
    entries = {e.path: e for e in result.manifest.entries}
    assert entries["kept"].sha256 == known
    assert entries["new"].sha256 == hashlib.sha256(b"v2").hexdigest()
    assert entries["new"].changed_while_read
    assert [(s.path, s.reason) for s in result.manifest.skipped] == [("gone", "changed_while_read")]
