"""Captures from a remote helper's listing (`infra.snapshots.ListingCapture`): the files the
helper marks unchanged in its bitmap are kept as the previous capture stored them, or fetched
when their blob is gone, and a bitmap that contradicts the listing fails the capture.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from infra import snapshots
from infra.blobs import BlobStore
from infra.snapshots import Listed, ListingCapture, capture_listing, listing_capture


def _listed(name: bytes, data: bytes, key: str) -> Listed:
    return Listed(
        raw=base64.b64encode(name).decode(),
        kind="file",
        mode=0o644,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        stat_key=key,
    )


def _fetch_from(
    contents: dict[bytes, bytes], asked: list[list[bytes]]
) -> Callable[[list[bytes]], Iterator[io.BytesIO]]:
    def fetch(paths: list[bytes]) -> Iterator[io.BytesIO]:
        asked.append(paths)
        buffer = io.BytesIO()
        with tarfile.open(
            fileobj=buffer, mode="w", encoding="utf-8", errors="surrogateescape"
        ) as archive:
            for path in paths:
                info = tarfile.TarInfo(path.decode("utf-8", "surrogateescape"))
                info.size = len(contents[path])
                archive.addfile(info, io.BytesIO(contents[path]))
        buffer.seek(0)
        yield buffer

    return fetch


def _bitmap(numbers: set[int], count: int) -> bytes:
    bits = bytearray((count + 7) // 8)
    for number in numbers:
        bits[number >> 3] |= 1 << (number & 7)
    return bytes(bits)


def test_unchanged_files_told_by_number_are_kept_as_stored_or_fetched_when_their_blob_is_gone(
    tmp_path: Path,
) -> None:
    """The remote scan's bitmap (`ListingCapture.collect`'s ``unchanged``): the marked files of
    the previous capture are kept byte for byte, one whose blob is gone is fetched, and the
    manifest is the one a capture listing every file gets."""
    store = BlobStore(tmp_path / "blobs")
    names = [b"a", b"b/c", b"b/d", "\u00e9".encode(), b"odd-\xff", b"z"]
    contents = {name: b"content of " + name for name in names}
    listed = [_listed(name, data, f"{i}:k") for i, (name, data) in enumerate(contents.items())]
    folder = Listed(raw=base64.b64encode(b"b").decode(), kind="dir", mode=0o755)
    first = capture_listing([folder, *listed], _fetch_from(contents, []), store)
    before = {e.key: e for e in first.manifest.entries}
    store.path(before[b"b/d"].sha256 or "").unlink()  # fetched again

    capture = ListingCapture(store, previous=first.manifest_sha256)
    numbered = [key for key, _, _, _ in capture.previous_files()]
    assert numbered == sorted(names)  # the files with a hash, in key order
    changed = {b"a": b"new content"}
    keep = {i for i, key in enumerate(numbered) if key not in changed}
    asked: list[list[bytes]] = []
    result = capture.collect(
        [folder, _listed(b"a", changed[b"a"], "9:k")],
        _fetch_from({**contents, **changed}, asked),
        unchanged=lambda: _bitmap(keep, len(numbered)),
    )
    assert asked == [[b"a", b"b/d"]]
    assert result.reused_hashes == len(names) - 2
    again = capture_listing(
        [folder, _listed(b"a", changed[b"a"], "9:k"), *listed[1:]],
        _fetch_from({**contents, **changed}, []),
        store,
    )
    assert result.manifest.parts == again.manifest.parts  # the same entries, byte for byte


def test_unchanged_bitmap_that_repeats_a_listed_path_or_names_no_file_fails(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    contents = {b"a": b"one", b"b": b"two"}
    listed = [_listed(name, data, f"{i}:k") for i, (name, data) in enumerate(contents.items())]
    first = capture_listing(listed, _fetch_from(contents, []), store)
    for bitmap in (_bitmap({0, 1}, 2), _bitmap({0, 5}, 8)):  # a listed too; no file 5
        capture = ListingCapture(store, previous=first.manifest_sha256)
        with pytest.raises(snapshots.CaptureError):
            fetch = _fetch_from(contents, [])
            capture.collect([listed[0]], fetch, unchanged=partial(bytes, bitmap))


@pytest.mark.parametrize("batch", [3, listing_capture.FETCH_BATCH_FILES])
def test_fetched_members_are_judged_in_batches_as_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """`_FetchBatch`: the first member of a repeated path is kept (in the same batch or a later
    one), a member nobody asked for is passed over without a blob, a folder where a file was
    listed and a listed file missing from the archive are skipped, and a file whose content
    differs from its listed hash is marked as changed while read."""
    monkeypatch.setattr(listing_capture, "FETCH_BATCH_FILES", batch)
    store = BlobStore(tmp_path / "blobs")
    names = [f"f{i:02d}".encode() for i in range(10)]
    contents = {name: b"content of " + name for name in names}
    listed = [_listed(name, data, f"{i}:k") for i, (name, data) in enumerate(contents.items())]
    listed += [_listed(b"became-a-folder", b"x", "20:k"), _listed(b"vanished", b"y", "21:k")]
    listed += [_listed(b"rewritten", b"as listed", "22:k")]

    def fetch(paths: list[bytes]) -> Iterator[io.BytesIO]:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:

            def add(name: bytes, data: bytes) -> None:
                info = tarfile.TarInfo(name.decode())
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))

            for name in names[:4]:
                add(name, contents[name])
            add(b"f01", b"a repeat in the same batch or the next")
            add(b"not-asked", b"nobody listed this")
            for name in names[4:]:
                add(name, contents[name])
            add(b"f08", b"a repeat, batches later")
            folder = tarfile.TarInfo("became-a-folder")
            folder.type = tarfile.DIRTYPE
            archive.addfile(folder)
            add(b"rewritten", b"rewritten while read")
        buffer.seek(0)
        yield buffer

    result = capture_listing(listed, fetch, store)
    entries = {e.key: e for e in result.manifest.entries}
    for name in names:
        assert entries[name].sha256 == hashlib.sha256(contents[name]).hexdigest()
        assert not entries[name].changed_while_read
    rewritten = entries[b"rewritten"]
    assert rewritten.changed_while_read and rewritten.stat_key is None
    assert rewritten.sha256 == hashlib.sha256(b"rewritten while read").hexdigest()
    skipped = {(s.path, s.reason, s.detail) for s in result.manifest.skipped}
    assert ("became-a-folder", "changed_while_read", "not a file any more") in skipped
    assert ("vanished", "changed_while_read", "gone before it was fetched") in skipped
    assert b"became-a-folder" not in entries and b"vanished" not in entries
    for stray in (b"nobody listed this", b"a repeat, batches later"):
        assert not store.exists(hashlib.sha256(stray).hexdigest())
    # the listed files, the rewritten one, the entries' part, the skip records' part, the manifest
    assert result.new_blobs == len(names) + 1 + 3


def test_new_content_past_the_capture_budget_is_skipped_and_never_fetched(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    known = b"k" * 100
    store.put_bytes(known)  # in the store already: costs no budget
    contents = {b"a": b"a" * 100, b"b": b"b" * 100, b"c": b"c" * 100, b"d": b"a" * 100}
    contents[b"known"] = known
    listing = [_listed(name, data, f"{index}:1:1:1") for index, (name, data) in
               enumerate(contents.items())]  # fmt: skip
    asked: list[list[bytes]] = []
    result = capture_listing(
        listing,
        _fetch_from(contents, asked),
        store,
        snapshots.Limits(max_new_bytes=250),
    )
    # a, then b (200 bytes); c would pass 250; d has a's content, counted once
    assert asked == [[b"a", b"b", b"d"]]
    kept = {entry.path for entry in result.manifest.entries}
    assert kept == {"a", "b", "d", "known"}
    (skipped,) = result.manifest.skipped
    assert (skipped.path, skipped.reason, skipped.size) == ("c", "over_budget", 100)
    assert "capped at 250 bytes" in skipped.detail
