"""Capture from a listing hashed where the files are (a remote host's helper): only the files
whose content is not stored yet are fetched."""

from __future__ import annotations

import base64
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO, Literal

from pydantic import BaseModel

from infra.blobs import BlobStore
from infra.snapshots.collector import (
    BlobWrites,
    Collector,
    PreviousRow,
    clean_name,
    decode_name,
    dir_entry,
    member_name_bytes,
    previous_rows,
    symlink_entry,
)
from infra.snapshots.manifest import CaptureError, CaptureResult, Entry, Limits, Manifest

# Fetched members judged at once (`_FetchBatch`), and the most of their content held meanwhile.
FETCH_BATCH_FILES = 256
FETCH_BATCH_BYTES = 16 * 1024 * 1024
# Rows of a previous manifest a listing capture keeps from telling its helper, to index them
# without reading the parts again (`ListingCapture.previous_files`): about 15 MiB at most.
PREVIOUS_ROWS_HELD = 50_000


class Listed(BaseModel):
    """One path as a helper on the workspace's host saw it (`infra.remote_capture`).

    ``raw`` is the path's bytes (base64) relative to the submission root; ``kind`` is ``file``,
    ``dir``, ``symlink``, ``other`` (a special file; ``detail`` names it) or ``error`` (could not
    be read; ``detail`` says why). ``sha256`` is set for the files within the size limit it
    could read. Files unchanged since the previous capture are not listed: the helper marks
    them in a bitmap (`ListingCapture.collect`'s ``unchanged``).
    """

    raw: str
    kind: Literal["file", "dir", "symlink", "other", "error"]
    mode: int = 0
    size: int = 0
    mtime: float = 0.0
    sha256: str | None = None
    target: str | None = None  # base64 of a symlink's target
    detail: str = ""
    stat_key: str | None = None  # files: inode:size:mtime_ns:ctime_ns, as `_stat_key`
    staged: bool = False  # the helper already packed this file's content for fetching


Fetch = Callable[[list[bytes]], Iterable[BinaryIO]]


def capture_listing(
    listing: Iterable[Listed],
    fetch: Fetch,
    store: BlobStore,
    limits: Limits | None = None,
    source: str = "listing",
    previous: Manifest | str | None = None,
) -> CaptureResult:
    """Capture from a listing whose files were hashed on their host: only files whose content
    the store lacks are fetched (`fetch(paths)` yields tar streams holding them, by relative
    path). Names, links, special files, ignored folders and size limits are judged exactly as
    in the other captures (same `Collector`), so the manifest is the same kind.

    ``previous`` is a manifest or its digest in `store`, indexed part by part into the
    capture's spool (`ListingCapture` takes the helper's bitmap of files unchanged since then).

    A fetched file whose content no longer matches its listed hash changed in between: what
    arrived is kept, marked ``changed_while_read``; one that did not arrive as a regular file is
    skipped as ``changed_while_read``.
    """
    return ListingCapture(store, limits, source, previous).collect(listing, fetch)


class ListingCapture:
    """`capture_listing` in steps, for a helper that must be told the previous capture's files
    before it lists (`infra.remote_capture`): `previous_files` reads them from the previous
    manifest's parts as they are; `prepare` (the caller's idle time while the helper scans, or
    `collect`) indexes them into the capture's spool and checks their blobs."""

    def __init__(
        self,
        store: BlobStore,
        limits: Limits | None = None,
        source: str = "listing",
        previous: Manifest | str | None = None,
    ) -> None:
        self.collector = Collector(store, limits or Limits(), source)
        self.store = store
        self.previous = previous
        self.prepared = False
        self.rows: list[PreviousRow] | None = None  # `previous_files`' read, for `prepare`

    def previous_files(self) -> Iterator[tuple[bytes, str | None, int, str]]:
        """The previous capture's hashed files: (path bytes, stat key, mode, sha256), numbered
        from 0 in this order for `collect`'s ``unchanged`` (the index's ``ord``: same rows,
        same order). Raises KeyError or ValueError for a damaged previous manifest (whose
        index is then empty: nothing is taken as unchanged)."""
        if self.previous is None:
            return
        rows: list[PreviousRow] | None = []
        for row in previous_rows(self.collector.spool.db, self.store, self.previous):
            if rows is not None and (row[1] or row[2]):
                rows.append(row)
                if len(rows) > PREVIOUS_ROWS_HELD:
                    rows = None
            if row[2]:
                yield row[0], row[1], row[3], row[2]
        self.rows = rows

    def prepare(self) -> None:
        """Index the previous manifest and check which of its files lost their blob
        (`Collector.load_previous`, `Collector.check_previous_blobs`); once."""
        if self.prepared:
            return
        self.prepared = True
        if self.previous is not None:
            self.collector.load_previous(self.store, self.previous, hashed=True, rows=self.rows)
            self.rows = None
        self.collector.check_previous_blobs()

    def collect(
        self,
        listing: Iterable[Listed],
        fetch: Fetch,
        unchanged: Callable[[], bytes] | None = None,
    ) -> CaptureResult:
        """Judge the listing, then keep the previous files ``unchanged()`` marks (a bitmap over
        `previous_files`' numbers, asked for once the listing is read: see
        `Collector.keep_unchanged`), fetch what the store lacks, store the manifest."""
        try:
            self.prepare()
            _collect_listing(self.collector, listing, fetch, unchanged)
        except BaseException:
            self.collector.close()
            raise
        return self.collector.finish()

    def close(self) -> None:
        """Free the capture's index (a capture that was collected is closed already)."""
        self.collector.close()


def _collect_listing(
    collector: Collector,
    listing: Iterable[Listed],
    fetch: Fetch,
    unchanged: Callable[[], bytes] | None = None,
) -> None:
    for item in listing:
        raw = base64.b64decode(item.raw)
        cleaned = clean_name(raw)
        display, raw_b64 = decode_name(raw if cleaned is None else cleaned)
        if item.kind == "error":
            collector.skip(display, "unreadable", item.size, item.detail)
            continue
        key = collector.admit(cleaned, display, item.size)
        if key is None:
            continue
        mode = item.mode & 0o7777
        if item.kind == "dir":
            collector.keep(key, dir_entry(display, raw_b64, mode, item.mtime))
        elif item.kind == "symlink":
            link = base64.b64decode(item.target or "")
            collector.keep(key, symlink_entry(display, raw_b64, mode, item.mtime, link))
        elif item.kind == "other":
            collector.skip(display, "special_file", 0, item.detail)
        else:
            _collect_listed_file(collector, key, item)
    if unchanged is not None:
        collector.keep_unchanged(unchanged())
    _fetch_wanted(collector, fetch)


def _collect_listed_file(collector: Collector, key: bytes, item: Listed) -> None:
    """One listed file, admitted as `key`, judged on its own."""
    display, raw_b64 = decode_name(key)
    mode = item.mode & 0o7777
    if item.size > collector.limits.max_file_bytes:
        collector.skip(display, "too_large", item.size)
    elif item.sha256 is None:
        collector.skip(display, "unreadable", item.size, item.detail or "not hashed")
    else:
        entry = Entry(
            path=display,
            type="file",
            size=item.size,
            mode=mode,
            mtime=item.mtime,
            sha256=item.sha256,
            raw_name=raw_b64,
            stat_key=item.stat_key,
        )
        if collector.has_blob(item.sha256):
            collector.reused += 1
            collector.keep(key, entry)
        else:
            collector.want(key, entry)


def _fetch_wanted(collector: Collector, fetch: Fetch) -> None:
    keys = collector.wanted_keys()
    if not keys:
        return
    writes = BlobWrites(collector)
    try:
        _fetch_into(collector, fetch, keys, writes)
    finally:
        try:
            writes.close()
        except OSError as exc:
            raise CaptureError(f"storing fetched files failed: {exc}") from exc


def _fetch_into(collector: Collector, fetch: Fetch, keys: list[bytes], writes: BlobWrites) -> None:
    limit = collector.limits.max_file_bytes
    for stream in fetch(keys):
        batch = _FetchBatch(collector, writes)
        try:
            with tarfile.open(
                fileobj=stream, mode="r|*", encoding="utf-8", errors="surrogateescape"
            ) as archive:
                for member in archive:
                    key = clean_name(member_name_bytes(member.name))
                    if key is None:
                        continue
                    data: bytes | None = None
                    if member.isfile() and member.size <= limit:
                        handle = archive.extractfile(member)
                        data = handle.read() if handle is not None else b""
                    batch.add(key, member.size, data)
            batch.flush()
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise CaptureError(f"fetching changed files broke off: {exc}") from exc
    for entry in collector.still_wanted():
        collector.skip(entry.path, "changed_while_read", entry.size, "gone before it was fetched")


class _FetchBatch:
    """Fetched members judged `FETCH_BATCH_FILES` at a time (at most `FETCH_BATCH_BYTES` of
    their content held): their wanted entries taken in one query and kept in one statement.
    A statement per member was most of a small capture's fetch: each one lets the SQLite call
    give up the interpreter lock, and with the SSH transport's and the blob writers' threads
    running, taking it back waited."""

    def __init__(self, collector: Collector, writes: BlobWrites) -> None:
        self.collector = collector
        self.writes = writes
        self.members: list[tuple[bytes, int, bytes | None]] = []
        self.held = 0

    def add(self, key: bytes, size: int, data: bytes | None) -> None:
        """A member: its path, its size in the archive, its content (None when it is not a
        file within the size limit any more)."""
        self.members.append((key, size, data))
        self.held += len(data or b"")
        if len(self.members) >= FETCH_BATCH_FILES or self.held >= FETCH_BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Keep the wanted members (the first of a repeated path; the others, and paths not
        wanted, are passed over, as they were before batching)."""
        members, self.members, self.held = self.members, [], 0
        if not members:
            return
        collector = self.collector
        wanted = collector.take_wanted(list(dict.fromkeys(key for key, _, _ in members)))
        kept: list[tuple[bytes, Entry]] = []
        for key, size, data in members:
            entry = wanted.pop(key, None)
            if entry is None:
                continue
            if data is None:
                collector.skip(entry.path, "changed_while_read", size, "not a file any more")
                continue
            digest = self.writes.put(data)
            changed = digest != entry.sha256 or len(data) != entry.size
            update = {
                "sha256": digest,
                "size": len(data),
                "changed_while_read": changed,
                # A file that changed while read is hashed again next time.
                "stat_key": None if changed else entry.stat_key,
            }
            kept.append((key, entry.model_copy(update=update)))
        collector.keep_files(kept)
