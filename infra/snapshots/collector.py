"""The core every capture shares: names checked and keyed by their bytes, entries and skip
records spooled to disk, new blobs written a few at a time, the manifest stored in parts."""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import re
import sqlite3
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import Any

from infra.blobs import BlobStore
from infra.snapshots.manifest import (
    NAME_MAX_BYTES,
    PATH_MAX_BYTES,
    CaptureError,
    CaptureResult,
    Entry,
    EntryPart,
    Limits,
    Manifest,
    Skipped,
    SkipReason,
    b64,
)

# A manifest is stored in parts of this many entries (and skip records), each a blob, named in
# order by the manifest's own blob: a capture holds one part at a time, whatever the tree.
PART_ENTRIES = 4096
# New blobs of a listing capture's fetched files (and any capture's manifest parts) written at
# once (`BlobWrites`), and the bytes that may wait for their writes.
WRITE_THREADS = 8
WRITE_AHEAD_BYTES = 64 * 1024 * 1024
# Folders of new blobs synced at once (`_fsync_dirs`).
FSYNC_THREADS = 16
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# -- names ---------------------------------------------------------------------------------------


def member_name_bytes(name: str) -> bytes:
    """A tar member's name as the bytes it was sent as (tarfile decodes with surrogateescape)."""
    return name.encode("utf-8", "surrogateescape")


def decode_name(raw: bytes) -> tuple[str, str | None]:
    """A printable name, and the original bytes (base64) when they are not UTF-8."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace"), b64(raw)


def dir_entry(display: str, raw_b64: str | None, mode: int, mtime: float) -> Entry:
    return Entry(path=display, type="dir", mode=mode, mtime=mtime, raw_name=raw_b64)


def symlink_entry(
    display: str, raw_b64: str | None, mode: int, mtime: float, raw_target: bytes
) -> Entry:
    """A symbolic link as captured: its target kept byte for byte, never followed."""
    target, raw_target_b64 = decode_name(raw_target)
    return Entry(
        path=display,
        type="symlink",
        mode=mode,
        mtime=mtime,
        target=target,
        raw_name=raw_b64,
        raw_target=raw_target_b64,
    )


def clean_name(raw: bytes) -> bytes | None:
    """A relative path with no ``.``/``..``/empty parts, or None when it would escape."""
    if raw.startswith(b"/") or b"\x00" in raw:
        return None
    parts = [p for p in raw.split(b"/") if p not in (b"", b".")]
    if any(p == b".." for p in parts):
        return None
    return b"/".join(parts)


def too_long(raw: bytes) -> bool:
    return len(raw) > PATH_MAX_BYTES or any(len(p) > NAME_MAX_BYTES for p in raw.split(b"/"))


class _Spool:
    """A capture's entries and skip records as they are found, in a private temporary SQLite
    database on disk (deleted when closed): memory stays at SQLite's page cache whatever the
    tree holds, and `finish` reads them back in key order, one part at a time."""

    def __init__(self) -> None:
        self.db = sqlite3.connect("", isolation_level=None)  # "": temporary, on disk
        self.db.executescript(
            """
            PRAGMA journal_mode = OFF;
            PRAGMA synchronous = OFF;
            PRAGMA temp_store = FILE;
            PRAGMA cache_size = -8192;
            CREATE TABLE entry (key BLOB PRIMARY KEY, kind TEXT, size INTEGER, json TEXT)
                WITHOUT ROWID;
            CREATE TABLE previous (key BLOB PRIMARY KEY, stat_key TEXT, sha256 TEXT,
                mode INTEGER, raw_name TEXT, size INTEGER, json TEXT, ord INTEGER)
                WITHOUT ROWID;
            CREATE TABLE unchanged (lo INTEGER, hi INTEGER);
            CREATE TABLE gone (ord INTEGER PRIMARY KEY);
            CREATE TABLE wanted (key BLOB PRIMARY KEY, json TEXT) WITHOUT ROWID;
            CREATE TABLE ignored (prefix BLOB PRIMARY KEY, size INTEGER, count INTEGER)
                WITHOUT ROWID;
            CREATE TABLE skipped (path TEXT, reason TEXT, seq INTEGER, json TEXT,
                PRIMARY KEY (path, reason, seq)) WITHOUT ROWID;
            BEGIN;
            """
        )
        self.seq = 0

    def close(self) -> None:
        self.db.close()


class Collector:
    """Shared bookkeeping of a capture: kept entries, skipped paths, ignored folders summed,
    all spooled to disk (`_Spool`), so that a tree of any number of files costs bounded memory.

    Everything is keyed by the raw bytes of the path: a name that is the byte 0xff and one that
    is the four characters ``\xff`` print alike and are two entries.
    """

    def __init__(self, store: BlobStore, limits: Limits, source: str) -> None:
        self.store = store
        self.limits = limits
        self.source = source
        self.spool = _Spool()
        self.symlink_count = 0
        self.new_blobs = 0
        self.new_bytes = 0  # new content admitted so far (`fits_budget`)
        self.budgeted: set[str] = set()  # its digests (at most the budget's worth of files)
        self.new_dirs: set[Path] = set()
        self.reused = 0
        patterns = [fnmatch.translate(p) for p in limits.ignore]
        self.ignore_re = re.compile("|".join(patterns)) if patterns else None
        self.blob_root = os.fspath(store.root)
        self.blobs_checked = False  # `check_previous_blobs`

    def close(self) -> None:
        self.spool.close()

    def ignored_prefix(self, raw: bytes) -> bytes | None:
        if self.ignore_re is None:
            return None
        parts = raw.split(b"/")
        for index, part in enumerate(parts):
            if self.ignore_re.match(part.decode("utf-8", "surrogateescape")):
                return b"/".join(parts[: index + 1])
        return None

    def has_blob(self, digest: str) -> bool:
        """BlobStore.exists without its per-call validation: the hot path of incremental captures
        (the digest comes from a manifest this module wrote)."""
        return os.path.exists(f"{self.blob_root}/{digest[:2]}/{digest[2:4]}/{digest}")

    def under_symlink(self, raw: bytes) -> bytes | None:
        if not self.symlink_count:
            return None
        parts = raw.split(b"/")
        for index in range(1, len(parts)):
            prefix = b"/".join(parts[:index])
            row = self.spool.db.execute(
                "SELECT 1 FROM entry WHERE key = ? AND kind = 'symlink'", (prefix,)
            ).fetchone()
            if row is not None:
                return prefix
        return None

    def skip(self, path: str, reason: SkipReason, size: int = 0, detail: str = "") -> None:
        record = Skipped(path=path, reason=reason, size=size, detail=detail)
        self._add_skipped(record)

    def _add_skipped(self, record: Skipped) -> None:
        self.spool.seq += 1
        self.spool.db.execute(
            "INSERT INTO skipped VALUES (?, ?, ?, ?)",
            (record.path, record.reason, self.spool.seq, record.model_dump_json()),
        )

    def skip_ignored(self, prefix: bytes, size: int) -> None:
        self.spool.db.execute(
            "INSERT INTO ignored VALUES (?, ?, 1) ON CONFLICT (prefix) "
            "DO UPDATE SET size = size + excluded.size, count = count + 1",
            (prefix, size),
        )

    def admit(self, raw: bytes | None, display: str, size: int) -> bytes | None:
        """The path's bytes if this member may be kept, else records why not and returns None."""
        if raw is None:
            self.skip(display, "unsafe_path", size, "absolute path or '..' component")
            return None
        if raw == b"":
            return None
        if too_long(raw):
            detail = f"{len(raw)} bytes; at most {PATH_MAX_BYTES}, {NAME_MAX_BYTES} per name"
            self.skip(display, "path_too_long", size, detail)
            return None
        prefix = self.ignored_prefix(raw)
        if prefix is not None:
            self.skip_ignored(prefix, size)
            return None
        link = self.under_symlink(raw)
        if link is not None:
            self.skip(display, "unsafe_path", size, f"under the symlink {decode_name(link)[0]}")
            return None
        if self.get(raw) is not None:
            self.skip(display, "duplicate", size, "a later archive member repeats this path")
            return None
        return raw

    def get(self, raw: bytes) -> Entry | None:
        row = self.spool.db.execute("SELECT json FROM entry WHERE key = ?", (raw,)).fetchone()
        return None if row is None else Entry.model_validate_json(row[0])

    def keep(self, raw: bytes, entry: Entry) -> None:
        """Keep (or replace) the entry of `raw`."""
        self.spool.db.execute(
            "INSERT OR REPLACE INTO entry VALUES (?, ?, ?, ?)",
            (raw, entry.type, entry.size, entry.model_dump_json(exclude_defaults=True)),
        )
        if entry.type == "symlink":
            self.symlink_count += 1

    def keep_content(
        self,
        raw: bytes,
        display: str,
        data: bytes,
        mode: int,
        mtime: float,
        raw_b64: str | None,
        *,
        changed_while_read: bool = False,
        stat_key: str | None = None,
    ) -> None:
        """Keep a file whose content was read whole here: the content as a blob, its entry. New
        content past the capture's budget (`Limits.max_new_bytes`) is skipped instead."""
        digest = hashlib.sha256(data).hexdigest()
        if not self.has_blob(digest):
            if not self.fits_budget(display, digest, len(data)):
                return
            self._store(digest, data)
        entry = Entry(
            path=display,
            type="file",
            size=len(data),
            mode=mode,
            mtime=mtime,
            sha256=digest,
            raw_name=raw_b64,
            changed_while_read=changed_while_read,
            stat_key=stat_key,
        )
        self.keep(raw, entry)

    def keep_files(self, kept: Sequence[tuple[bytes, Entry]]) -> None:
        """`keep` for many files at once (one statement)."""
        rows = [(raw, e.size, e.model_dump_json(exclude_defaults=True)) for raw, e in kept]
        self.spool.db.executemany("INSERT OR REPLACE INTO entry VALUES (?, 'file', ?, ?)", rows)

    def load_previous(
        self,
        store: BlobStore,
        previous: Manifest | str,
        hashed: bool = False,
        rows: Iterable[PreviousRow] | None = None,
    ) -> None:
        """Index the previous capture's files that carry a stat key (with `hashed`, every file
        with a hash: a listing capture tells its helper which content is known), read part by
        part. Those with a hash are numbered (``ord``) in key order, as
        `ListingCapture.previous_files` numbers them: `keep_unchanged` is told them by number.
        `rows`: the manifest's rows (`previous_rows`) when they were read already."""
        db = self.spool.db
        counter = iter(range(1 << 62))
        try:
            db.executemany(
                "INSERT OR REPLACE INTO previous VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    (*row, next(counter) if row[2] else None)
                    for row in (previous_rows(db, store, previous) if rows is None else rows)
                    if row[1] or (hashed and row[2])
                ),
            )
        except (KeyError, ValueError, TypeError):  # a damaged previous manifest: re-hashing
            db.execute("DELETE FROM previous")
        db.execute("CREATE INDEX previous_ord ON previous (ord)")

    def previous(self, raw: bytes) -> Entry | None:
        row = self.spool.db.execute("SELECT json FROM previous WHERE key = ?", (raw,)).fetchone()
        return None if row is None else Entry.model_validate_json(row[0])

    def check_previous_blobs(self) -> None:
        """Note which of the previous capture's hashed files have lost their blob from the store
        (table ``gone``): `keep_unchanged` fetches those instead of keeping them. Done once per
        capture, whenever the caller is idle (`infra.remote_capture` does it while the helper
        scans); one existence check per file, the paths made by SQLite."""
        if self.blobs_checked:
            return
        rows = self.spool.db.execute(
            "SELECT ord, ? || '/' || substr(sha256, 1, 2) || '/' || substr(sha256, 3, 2) || '/' "
            "|| sha256 FROM previous WHERE ord IS NOT NULL",
            (self.blob_root,),
        ).fetchall()
        present = map(os.access, (path for _, path in rows), repeat(os.F_OK))
        gone = [(ord_,) for (ord_, _), here in zip(rows, present, strict=True) if not here]
        self.spool.db.executemany("INSERT INTO gone VALUES (?)", gone)
        self.blobs_checked = True

    def keep_unchanged(self, bitmap: bytes) -> None:
        """Keep the previous files whose ``ord`` bit is set in `bitmap` (bit ``ord % 8`` of byte
        ``ord // 8``) as the previous capture stored them: a helper found each with the same
        stat key and mode, not ignored, within the size limit. One
        insert from the index, whatever their number: no row per file crosses into Python; a
        file whose blob is gone from the store (`check_previous_blobs`) is fetched. A path kept
        twice means the listing is broken: the capture fails."""
        self.check_previous_blobs()
        db = self.spool.db
        db.execute("DELETE FROM unchanged")
        runs = list(_runs(bitmap))
        db.executemany("INSERT INTO unchanged VALUES (?, ?)", runs)
        marked = "FROM unchanged u JOIN previous p ON p.ord BETWEEN u.lo AND u.hi"
        (count,) = db.execute(f"SELECT count(*) {marked}").fetchone()
        if count != sum(hi - lo + 1 for lo, hi in runs):
            raise CaptureError("the listing keeps files the previous capture did not have")
        chosen = f"{marked} WHERE p.ord NOT IN (SELECT ord FROM gone)"
        # Both checks start from the small side (CROSS JOIN keeps SQLite to that order).
        twice = db.execute(
            "SELECT 1 FROM wanted w CROSS JOIN previous p ON p.key = w.key "
            "CROSS JOIN unchanged u ON p.ord BETWEEN u.lo AND u.hi "
            "WHERE p.ord NOT IN (SELECT ord FROM gone)"
        )
        try:
            if twice.fetchone() is not None:
                raise sqlite3.IntegrityError("listed and unchanged")
            kept = db.execute(f"INSERT INTO entry SELECT p.key, 'file', p.size, p.json {chosen}")
        except sqlite3.IntegrityError as exc:
            raise CaptureError(f"the listing names a path twice ({exc})") from exc
        self.reused += kept.rowcount
        for key, text in db.execute(
            "SELECT p.key, p.json FROM gone g CROSS JOIN previous p ON p.ord = g.ord "
            "CROSS JOIN unchanged u ON g.ord BETWEEN u.lo AND u.hi"
        ).fetchall():
            self.want(key, Entry.model_validate_json(text))

    def want(self, raw: bytes, entry: Entry) -> None:
        """A listed file whose content the store lacks: kept once fetched (`capture_listing`);
        skipped without fetching when it does not fit the capture's budget."""
        if not self.fits_budget(entry.path, entry.sha256 or "", entry.size):
            return
        self.spool.db.execute(
            "INSERT OR REPLACE INTO wanted VALUES (?, ?)", (raw, entry.model_dump_json())
        )

    def wanted_keys(self) -> list[bytes]:
        return [key for (key,) in self.spool.db.execute("SELECT key FROM wanted ORDER BY key")]

    def take_wanted(self, keys: Sequence[bytes]) -> dict[bytes, Entry]:
        """The wanted entries of `keys` (those still wanted), no longer wanted once taken."""
        db = self.spool.db
        marks = ",".join("?" * len(keys))
        rows = db.execute(f"SELECT key, json FROM wanted WHERE key IN ({marks})", keys).fetchall()
        db.execute(f"DELETE FROM wanted WHERE key IN ({marks})", keys)
        return {key: Entry.model_validate_json(text) for key, text in rows}

    def still_wanted(self) -> Iterator[Entry]:
        for (text,) in self.spool.db.execute("SELECT json FROM wanted ORDER BY key").fetchall():
            yield Entry.model_validate_json(text)

    def put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if not self.store.exists(digest):
            self._store(digest, data)
        return digest

    def _store(self, digest: str, data: bytes) -> None:
        self.store.put_bytes(data)
        self.new_blobs += 1
        self.new_dirs.add(self.store.path(digest).parent)

    def fits_budget(self, display: str, digest: str, size: int) -> bool:
        """Whether new content (`digest`, not in the store) may be added by this capture: each
        distinct content is counted once against `Limits.max_new_bytes`; past it the file is
        skipped as `over_budget`, so the portal's disk takes at most that much per capture."""
        if digest in self.budgeted:
            return True
        budget = self.limits.max_new_bytes
        if self.new_bytes + size > budget:
            detail = f"the capture's new content is capped at {budget} bytes"
            self.skip(display, "over_budget", size, detail)
            return False
        self.new_bytes += size
        self.budgeted.add(digest)
        return True

    def finish(self) -> CaptureResult:
        """Store the entries and skip records in parts, then the manifest naming them.

        Parts are blobs like any other, written (and their folders synced) before the manifest:
        the manifest's digest, which the database records, never names a part not yet stored.
        The parts are written a few at a time (`BlobWrites`), each still synced before its
        rename."""
        writes = BlobWrites(self)
        try:
            db = self.spool.db
            for prefix, size, count in db.execute("SELECT * FROM ignored ORDER BY prefix"):
                display, _ = decode_name(prefix)
                self._add_skipped(Skipped(path=display, reason="ignored", size=size, count=count))
            file_count = total_bytes = 0
            parts: list[str] = []
            rows = db.execute("SELECT kind, size, json FROM entry ORDER BY key")
            for chunk in _batches(rows):
                for kind, size, _ in chunk:
                    if kind == "file":
                        file_count += 1
                        total_bytes += size
                parts.append(writes.put(_joined("entries", (text for _, _, text in chunk))))
            skipped_count = 0
            skipped_parts: list[str] = []
            ordered = db.execute("SELECT json FROM skipped ORDER BY path, reason, seq")
            for chunk in _batches(ordered):
                skipped_count += len(chunk)
                skipped_parts.append(writes.put(_joined("skipped", (text for (text,) in chunk))))
        finally:
            try:
                writes.close()
            finally:
                self.close()
        head = Manifest(
            source=self.source,
            limits=self.limits,
            parts=parts,
            skipped_parts=skipped_parts,
            file_count=file_count,
            total_bytes_kept=total_bytes,
        )
        _fsync_dirs(self.new_dirs)
        digest = self.put(head.model_dump_json().encode())
        _fsync_dirs({self.store.path(digest).parent})
        return CaptureResult(
            manifest_sha256=digest,
            new_blobs=self.new_blobs,
            reused_hashes=self.reused,
            file_count=file_count,
            total_bytes=total_bytes,
            skipped_count=skipped_count,
            store=self.store,
        )


def _batches(rows: Iterable[tuple[Any, ...]]) -> Iterator[list[tuple[Any, ...]]]:
    batch: list[tuple[Any, ...]] = []
    for row in rows:
        batch.append(row)
        if len(batch) == PART_ENTRIES:
            yield batch
            batch = []
    if batch:
        yield batch


def _joined(field_name: str, texts: Iterable[str]) -> bytes:
    """A part's blob: the JSON object {field_name: [...]} from already serialised items."""
    return ('{"' + field_name + '":[' + ",".join(texts) + "]}").encode()


_ENTRY_DEFAULTS = {name: f.default for name, f in Entry.model_fields.items()}
PreviousRow = tuple[bytes, str | None, str | None, int, str | None, int, str]


def previous_rows(
    db: sqlite3.Connection, store: BlobStore, previous: Manifest | str
) -> Iterator[PreviousRow]:
    """A manifest's entries as rows of the previous index: (key, stat key, sha256, mode, raw
    name, size, the entry's text as stored). A stored part is read without a model per entry:
    its texts come from SQLite's ``json_each`` (the compact text as written) and its fields
    from ``json.loads``, when the texts rebuild the part byte for byte; otherwise (an older
    or differently written part) through the model, as before."""
    if isinstance(previous, str):
        previous = Manifest.model_validate_json(store.get_bytes(previous))
    if not previous.parts:
        for e in previous.entries:
            text = e.model_dump_json(exclude_defaults=True)
            yield e.key, e.stat_key, e.sha256, e.mode, e.raw_name, e.size, text
        return
    mode, size = _ENTRY_DEFAULTS["mode"], _ENTRY_DEFAULTS["size"]
    for part in previous.parts:
        data = store.get_bytes(part)
        text = data.decode()
        texts = [t for (t,) in db.execute("SELECT value FROM json_each(?, '$.entries')", (text,))]
        if _joined("entries", texts) != data:
            for e in EntryPart.model_validate_json(data).entries:
                entry_text = e.model_dump_json(exclude_defaults=True)
                yield e.key, e.stat_key, e.sha256, e.mode, e.raw_name, e.size, entry_text
            continue
        for item, entry_text in zip(json.loads(text)["entries"], texts, strict=True):
            raw_name = item.get("raw_name")
            key = base64.b64decode(raw_name) if raw_name else item["path"].encode()
            yield (
                key,
                item.get("stat_key"),
                item.get("sha256"),
                item.get("mode", mode),
                raw_name,
                item.get("size", size),
                entry_text,
            )


def _runs(bitmap: bytes) -> Iterator[tuple[int, int]]:
    """The set bits of `bitmap` (bit ``i % 8`` of byte ``i // 8``) as inclusive ranges."""
    start = -1
    for index, byte in enumerate(bitmap):
        if byte in (0, 255) and (start >= 0) == (byte == 255):
            continue  # a whole byte that continues the current state
        for bit in range(8):
            number = index * 8 + bit
            if byte >> bit & 1:
                if start < 0:
                    start = number
            elif start >= 0:
                yield start, number - 1
                start = -1
    if start >= 0:
        yield start, len(bitmap) * 8 - 1


def _fsync_dirs(dirs: Iterable[Path]) -> None:
    """Make the renames of new blobs durable before the database points at them. The folders
    are synced a few at a time: a capture of many new blobs has as many folders, and each sync
    mostly waits on the disk."""
    folders = list(dirs)
    if len(folders) < 2:
        for folder in folders:
            _fsync_dir(folder)
        return
    with ThreadPoolExecutor(max_workers=min(FSYNC_THREADS, len(folders))) as pool:
        for _ in pool.map(_fsync_dir, folders):
            pass


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlobWrites:
    """The fetched files' new blobs: each is written to a temporary file here (`BlobStore.stage`)
    and synced and renamed by a pool (`BlobStore.commit`), so that only the waits on the disk
    overlap. The pool's threads run almost no Python: with whole writes in the pool, the
    threads taking turns with the one reading the fetched files made every call here that
    gives up the interpreter lock (a stat, a hash) wait to get it back, and a capture of 200
    small changed files spent 0.2 s on them. At most `WRITE_AHEAD_BYTES` wait to be synced;
    `close` returns once all are stored (the manifest, written after, never names a blob not
    yet stored)."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.pool = ThreadPoolExecutor(max_workers=WRITE_THREADS)
        self.queued: set[str] = set()
        self.inflight: deque[tuple[Future[None], int]] = deque()
        self.inflight_bytes = 0

    def put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        store = self.collector.store
        if digest in self.queued or self.collector.has_blob(digest):
            return digest
        self.queued.add(digest)
        self.collector.new_blobs += 1
        self.collector.new_dirs.add(store.path(digest).parent)
        staged = store.stage(digest, data)
        self.inflight.append((self.pool.submit(store.commit, staged), len(data)))
        self.inflight_bytes += len(data)
        while self.inflight_bytes > WRITE_AHEAD_BYTES:
            self._wait_oldest()
        return digest

    def _wait_oldest(self) -> None:
        future, size = self.inflight.popleft()
        self.inflight_bytes -= size
        future.result()

    def close(self) -> None:
        try:
            while self.inflight:
                self._wait_oldest()
        finally:
            self.pool.shutdown(wait=True)
