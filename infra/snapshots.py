"""Snapshot capture into the content-addressed blob store, and export, restore, verify and diff.

A snapshot is a manifest (one entry per kept path: size, mode, sha256, mtime; symlinks with their
target) stored as a blob itself, so one digest names a whole snapshot. File contents are blobs, so
identical files are stored once across all snapshots of all attempts.

Captures read a tar stream (what every workspace backend returns for /home/submission) or walk a
directory (the persisted submission volume of a dead workspace). Nothing is ever extracted: paths
that would escape (``..``, absolute names, names under a symlink), links, FIFOs and devices,
unreadable or oversized files, paths longer than the system can create, ignored folders (virtual
environments, caches) are recorded in the manifest's ``skipped`` list with the reason and size,
never followed, never written.

The participant controls the tree while it is read, so nothing here trusts a path string twice:
the directory walk and the restore open every level relative to its parent's descriptor with
``O_NOFOLLOW`` (a directory swapped for a symlink mid-walk is refused, not followed), and entries
are keyed by their raw bytes (two names that print alike are two entries). Exports and restores
never carry setuid/setgid/sticky bits nor a root owner, whatever the manifest says.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fnmatch
import hashlib
import io
import json
import os
import re
import sqlite3
import stat
import tarfile
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from itertools import repeat
from pathlib import Path
from typing import Any, BinaryIO, Literal, cast

from pydantic import BaseModel, Field

from infra.blobs import CHUNK, BlobStore
from infra.workspace import WorkspaceBackend, WorkspaceHandle

DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024
DEFAULT_IGNORE = (
    "venv",
    ".venv",
    "__pycache__",
    "node_modules",
    "wandb",
    ".cache",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".ipynb_checkpoints",
)
EXPORT_ROOT = "submission"
# Longest relative path kept (bytes): a longer one could not be created under a restore
# directory by path, nor extracted by an ordinary tar. NAME_MAX bounds each component.
PATH_MAX_BYTES = 4095 - len(EXPORT_ROOT) - 1
NAME_MAX_BYTES = 255
# Owner written into exports: the workspace user (uid 1000 in the workspace images), never root,
# so extracting an export as root (as PaperBench's reproduction does) creates nothing root owns.
EXPORT_UID = EXPORT_GID = 1000
# Reads of a live workspace's archive: a member that changes while the engine sends it ends the
# stream; the capture is read again this many times in all before keeping what arrived.
ARCHIVE_PASSES = 3
# Bits an export or restore may carry: permissions only, never setuid/setgid/sticky.
PERMISSION_BITS = 0o777

MEMBER_READ = 64 * 1024
# A manifest is stored in parts of this many entries (and skip records), each a blob, named in
# order by the manifest's own blob: a capture holds one part at a time, whatever the tree.
PART_ENTRIES = 4096
# New blobs of a listing capture's fetched files (and any capture's manifest parts) written at
# once (`_BlobWrites`), and the bytes that may wait for their writes.
WRITE_THREADS = 8
# Fetched members judged at once (`_FetchBatch`), and the most of their content held meanwhile.
FETCH_BATCH_FILES = 256
FETCH_BATCH_BYTES = 16 * 1024 * 1024
WRITE_AHEAD_BYTES = 64 * 1024 * 1024
# Folders of new blobs synced at once (`_fsync_dirs`).
FSYNC_THREADS = 16
MANIFEST_VERSION = 2
# Rows of a previous manifest a listing capture keeps from telling its helper, to index them
# without reading the parts again (`ListingCapture.previous_files`): about 15 MiB at most.
PREVIOUS_ROWS_HELD = 50_000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

SkipReason = Literal[
    "ignored",
    "too_large",
    "unsafe_path",
    "special_file",
    "unreadable",
    "hardlink",
    "duplicate",
    "path_too_long",
    "changed_while_read",
]


class CaptureError(Exception):
    """The source could not be read as a whole (broken or truncated archive); nothing is kept."""


class ArchiveTruncated(CaptureError):
    """The archive ended inside a file: the sender gave up on it (it changed while sent)."""

    def __init__(self, key: bytes, display: str, partial: bytes, member: tarfile.TarInfo) -> None:
        super().__init__(f"the archive could not be read to its end: it ended inside {display}")
        self.key = key
        self.display = display
        self.partial = partial
        self.member = member


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


class Entry(BaseModel):
    """One kept path. ``raw_name`` (base64) is set only when the name is not valid UTF-8, and
    ``raw_target`` likewise for a symlink's target: ``path`` and ``target`` are for reading, the
    raw bytes are what is restored and what identifies the entry."""

    path: str
    type: Literal["file", "dir", "symlink"]
    size: int = 0
    mode: int = 0o644
    sha256: str | None = None
    mtime: float = 0.0
    target: str | None = None
    raw_name: str | None = None
    raw_target: str | None = None
    changed_while_read: bool = False
    # Directory and helper captures: (inode, size, mtime_ns, ctime_ns), to reuse hashes next time.
    stat_key: str | None = None

    @property
    def key(self) -> bytes:
        """The path's bytes exactly as found."""
        return base64.b64decode(self.raw_name) if self.raw_name else self.path.encode()

    @property
    def target_bytes(self) -> bytes:
        if self.raw_target:
            return base64.b64decode(self.raw_target)
        return (self.target or "").encode()


class Skipped(BaseModel):
    path: str
    reason: SkipReason
    size: int = 0
    count: int = 1
    detail: str = ""


ExportPolicy = Literal["baseline", "paperbench"]


class Limits(BaseModel):
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    ignore: tuple[str, ...] = DEFAULT_IGNORE
    # Which layout policy chose ``ignore``; exports state it (see `limits_for_policy`).
    policy: ExportPolicy = "baseline"


def limits_for_policy(policy: ExportPolicy, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Limits:
    """Baseline drops caches and environments from snapshots; PaperBench's own tarball keeps
    ``.cache``, ``node_modules``, ``wandb``, ``__pycache__`` and ``venv`` (its reproduction
    removes ``venv``/``.venv`` before running, as ours does)."""
    ignore = DEFAULT_IGNORE if policy == "baseline" else ()
    return Limits(max_file_bytes=max_file_bytes, ignore=ignore, policy=policy)


class Manifest(BaseModel):
    """A snapshot's listing. Stored (version 2) as a head blob naming its parts in key order:
    ``parts`` (blobs of `PART_ENTRIES` entries) and ``skipped_parts`` (likewise, skip records,
    in (path, reason) order); `load_manifest` joins them into ``entries`` and ``skipped``, so
    readers see one manifest whatever the version. Version 1 kept both lists inline."""

    version: int = MANIFEST_VERSION
    source: str = ""
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    limits: Limits = Field(default_factory=Limits)
    entries: list[Entry] = Field(default_factory=list)
    skipped: list[Skipped] = Field(default_factory=list)
    parts: list[str] = Field(default_factory=list)
    skipped_parts: list[str] = Field(default_factory=list)
    file_count: int = 0
    total_bytes_kept: int = 0

    @property
    def files(self) -> list[Entry]:
        return [e for e in self.entries if e.type == "file"]

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files)

    def by_path(self) -> dict[str, Entry]:
        return {e.path: e for e in self.entries}

    def by_key(self) -> dict[bytes, Entry]:
        return {e.key: e for e in self.entries}


class _EntryPart(BaseModel):
    entries: list[Entry]


class _SkippedPart(BaseModel):
    skipped: list[Skipped]


@dataclass
class CaptureResult:
    """What a capture stored: the manifest's digest and its totals. ``manifest`` reads the whole
    listing back from the store, on demand (a capture itself never holds it)."""

    manifest_sha256: str
    new_blobs: int
    reused_hashes: int
    file_count: int
    total_bytes: int
    skipped_count: int
    store: BlobStore = field(repr=False)

    @cached_property
    def manifest(self) -> Manifest:
        return load_manifest(self.store, self.manifest_sha256)


# -- names ---------------------------------------------------------------------------------------


def _decode_name(raw: bytes) -> tuple[str, str | None]:
    """A printable name, and the original bytes (base64) when they are not UTF-8."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace"), _b64(raw)


def _dir_entry(display: str, raw_b64: str | None, mode: int, mtime: float) -> Entry:
    return Entry(path=display, type="dir", mode=mode, mtime=mtime, raw_name=raw_b64)


def _symlink_entry(
    display: str, raw_b64: str | None, mode: int, mtime: float, raw_target: bytes
) -> Entry:
    """A symbolic link as captured: its target kept byte for byte, never followed."""
    target, raw_target_b64 = _decode_name(raw_target)
    return Entry(
        path=display,
        type="symlink",
        mode=mode,
        mtime=mtime,
        target=target,
        raw_name=raw_b64,
        raw_target=raw_target_b64,
    )


def _clean(raw: bytes) -> bytes | None:
    """A relative path with no ``.``/``..``/empty parts, or None when it would escape."""
    if raw.startswith(b"/") or b"\x00" in raw:
        return None
    parts = [p for p in raw.split(b"/") if p not in (b"", b".")]
    if any(p == b".." for p in parts):
        return None
    return b"/".join(parts)


def _too_long(raw: bytes) -> bool:
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


class _Collector:
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
        if _too_long(raw):
            detail = f"{len(raw)} bytes; at most {PATH_MAX_BYTES}, {NAME_MAX_BYTES} per name"
            self.skip(display, "path_too_long", size, detail)
            return None
        prefix = self.ignored_prefix(raw)
        if prefix is not None:
            self.skip_ignored(prefix, size)
            return None
        link = self.under_symlink(raw)
        if link is not None:
            self.skip(display, "unsafe_path", size, f"under the symlink {_decode_name(link)[0]}")
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
        `rows`: the manifest's rows (`_previous_rows`) when they were read already."""
        db = self.spool.db
        counter = iter(range(1 << 62))
        try:
            db.executemany(
                "INSERT OR REPLACE INTO previous VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    (*row, next(counter) if row[2] else None)
                    for row in (_previous_rows(db, store, previous) if rows is None else rows)
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
        """A listed file whose content the store lacks: kept once fetched (`capture_listing`)."""
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
            self.store.put_bytes(data)
            self.new_blobs += 1
            self.new_dirs.add(self.store.path(digest).parent)
        return digest

    def finish(self) -> CaptureResult:
        """Store the entries and skip records in parts, then the manifest naming them.

        Parts are blobs like any other, written (and their folders synced) before the manifest:
        the manifest's digest, which the database records, never names a part not yet stored.
        The parts are written a few at a time (`_BlobWrites`), each still synced before its
        rename."""
        writes = _BlobWrites(self)
        try:
            db = self.spool.db
            for prefix, size, count in db.execute("SELECT * FROM ignored ORDER BY prefix"):
                display, _ = _decode_name(prefix)
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


def _previous_rows(
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
            for e in _EntryPart.model_validate_json(data).entries:
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


# -- capture from a tar stream -------------------------------------------------------------------


class ChunkReader(io.RawIOBase):
    """A readable stream over an iterator of byte chunks (an engine's archive as it arrives),
    so that a capture holds one chunk at a time, never the whole archive."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = bytes(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def archive_reader(backend: WorkspaceBackend, handle: WorkspaceHandle, path: str) -> BinaryIO:
    """Read a backend's archive of `path` as a stream: chunk by chunk when the backend can
    (``iter_archive``), else the whole tar it returns."""
    stream = getattr(backend, "iter_archive", None)
    if callable(stream):
        return cast(BinaryIO, io.BufferedReader(ChunkReader(stream(handle, path)), CHUNK))
    return io.BytesIO(backend.get_archive(handle, path))


def _strip_root(name: bytes, root: bytes | None) -> bytes:
    if root and (name == root or name.startswith(root + b"/")):
        return name[len(root) + 1 :]
    return name


def capture_tar(
    stream: BinaryIO,
    store: BlobStore,
    limits: Limits | None = None,
    root: str | None = EXPORT_ROOT,
    source: str = "tar",
) -> CaptureResult:
    """Capture a tar stream (read once, never extracted); ``root`` is a top folder to strip."""
    collector = _Collector(store, limits or Limits(), source)
    try:
        _read_archive(collector, stream, root)
    except BaseException:
        collector.close()
        raise
    return collector.finish()


def capture_archive(
    fetch: Callable[[], BinaryIO],
    store: BlobStore,
    limits: Limits | None = None,
    root: str | None = EXPORT_ROOT,
    source: str = "tar",
    passes: int = ARCHIVE_PASSES,
) -> CaptureResult:
    """Capture a live workspace's archive, `fetch`ed afresh for each pass.

    An engine sending a file that shrinks or grows meanwhile gives up on the whole archive
    inside that file. The archive is then read again (a file being rewritten is usually stable
    a moment later), and the file is marked ``changed_while_read``. If every pass ends inside a
    file, what arrived is kept: the files before it, its partial content marked as changed, and
    a ``changed_while_read`` skip entry saying the rest of the archive did not arrive.
    """
    changed: set[bytes] = set()
    for index in range(passes):
        collector = _Collector(store, limits or Limits(), source)
        try:
            try:
                _read_archive(collector, fetch(), root)
            except ArchiveTruncated as exc:
                changed.add(exc.key)
                if index + 1 < passes:
                    collector.close()
                    continue
                _keep_partial(collector, exc)
            for key in changed:
                entry = collector.get(key)
                if entry is not None and entry.type == "file":
                    collector.keep(key, entry.model_copy(update={"changed_while_read": True}))
        except BaseException:
            collector.close()
            raise
        return collector.finish()
    raise AssertionError("unreachable: the last pass always returns")


def _keep_partial(collector: _Collector, exc: ArchiveTruncated) -> None:
    member = exc.member
    _, raw_b64 = _decode_name(exc.key)
    collector.keep(
        exc.key,
        Entry(
            path=exc.display,
            type="file",
            size=len(exc.partial),
            mode=member.mode & 0o7777,
            mtime=member.mtime,
            sha256=collector.put(exc.partial),
            raw_name=raw_b64,
            changed_while_read=True,
        ),
    )
    collector.skip(
        exc.display,
        "changed_while_read",
        member.size,
        f"the archive ended inside this file in {ARCHIVE_PASSES} reads; "
        "members sent after it are missing",
    )


def _read_archive(collector: _Collector, stream: BinaryIO, root: str | None) -> None:
    root_raw = root.encode() if root else None
    try:
        with tarfile.open(
            fileobj=stream, mode="r|*", encoding="utf-8", errors="surrogateescape"
        ) as archive:
            for member in archive:
                _capture_member(collector, archive, member, root_raw)
    except ArchiveTruncated:
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise CaptureError(f"the archive could not be read to its end: {exc}") from exc


def _raw_name(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def _capture_member(
    collector: _Collector, archive: tarfile.TarFile, member: tarfile.TarInfo, root: bytes | None
) -> None:
    original = _raw_name(member.name)
    cleaned = _clean(_strip_root(original, root))
    display, raw_b64 = _decode_name(original if cleaned is None else cleaned)
    key = collector.admit(cleaned, display, member.size)
    if key is None:
        return
    mode = member.mode & 0o7777
    if member.isdir():
        collector.keep(key, _dir_entry(display, raw_b64, mode, member.mtime))
    elif member.issym():
        link = _raw_name(member.linkname)
        collector.keep(key, _symlink_entry(display, raw_b64, mode, member.mtime, link))
    elif member.islnk():
        _capture_hardlink(collector, member, key, display, raw_b64, root)
    elif member.isfile():
        # Decided from the header: the content of a file over the limit is passed over in
        # fixed-size reads, never held.
        if member.size > collector.limits.max_file_bytes:
            collector.skip(display, "too_large", member.size)
            return
        handle = archive.extractfile(member)
        if handle is None:
            collector.skip(display, "unreadable", member.size, "no data in the archive")
            return
        data = bytearray()
        try:
            # Modest reads: when the stream ends inside the file, what came whole is kept.
            while chunk := handle.read(MEMBER_READ):
                data += chunk
        except (tarfile.ReadError, EOFError) as exc:
            raise ArchiveTruncated(key, display, bytes(data), member) from exc
        if len(data) != member.size:
            raise ArchiveTruncated(key, display, bytes(data), member)
        collector.keep(
            key,
            Entry(
                path=display,
                type="file",
                size=len(data),
                mode=mode,
                mtime=member.mtime,
                sha256=collector.put(bytes(data)),
                raw_name=raw_b64,
            ),
        )
    else:
        kind = {
            tarfile.FIFOTYPE: "fifo",
            tarfile.CHRTYPE: "character device",
            tarfile.BLKTYPE: "block device",
        }.get(member.type, f"tar type {member.type!r}")
        collector.skip(display, "special_file", 0, kind)


def _capture_hardlink(
    collector: _Collector,
    member: tarfile.TarInfo,
    key: bytes,
    display: str,
    raw_b64: str | None,
    root: bytes | None,
) -> None:
    """A hard link names an earlier member; it is kept as a copy of that file when it is one."""
    target_raw = _raw_name(member.linkname)
    target = _clean(_strip_root(target_raw, root))
    original = collector.get(target) if target else None
    if original is None or original.type != "file":
        target_name, _ = _decode_name(target_raw)
        collector.skip(display, "hardlink", 0, f"link to {target_name!r}, not a kept file")
        return
    collector.keep(key, original.model_copy(update={"path": display, "raw_name": raw_b64}))


# -- capture from a directory --------------------------------------------------------------------


def capture_directory(
    root: Path,
    store: BlobStore,
    limits: Limits | None = None,
    previous: Manifest | str | None = None,
    source: str = "directory",
) -> CaptureResult:
    """Walk a directory without following links; reuse unchanged files' hashes from ``previous``
    (a manifest, or the digest of one in `store`, then read part by part).

    A file is unchanged when its (inode, size, mtime, ctime) match the previous capture's and its
    blob is present: ctime changes on every write and cannot be set back by a user, so a rewrite
    that restores the mtime is still noticed.
    """
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise CaptureError(f"{root} is not a readable directory: {exc.strerror}") from exc
    collector = _Collector(store, limits or Limits(), source)
    try:
        if previous is not None:
            collector.load_previous(store, previous)
        for raw_rel, parent, name, info in _walk(root_fd, os.fspath(root)):
            display, raw_b64 = _decode_name(raw_rel)
            if isinstance(info, OSError):
                collector.skip(display, "unreadable", 0, info.strerror or str(info))
                continue
            key = collector.admit(raw_rel, display, info.st_size)
            if key is None:
                continue
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISDIR(info.st_mode):
                collector.keep(key, _dir_entry(display, raw_b64, mode, info.st_mtime))
            elif stat.S_ISLNK(info.st_mode):
                try:
                    link = os.readlink(name, dir_fd=parent)
                except OSError as exc:
                    collector.skip(display, "unreadable", 0, exc.strerror or str(exc))
                    continue
                collector.keep(key, _symlink_entry(display, raw_b64, mode, info.st_mtime, link))
            elif stat.S_ISREG(info.st_mode):
                before = collector.previous(key) if previous is not None else None
                _capture_file(collector, parent, name, key, display, info, raw_b64, before)
            else:
                collector.skip(display, "special_file", 0, _file_kind(info.st_mode))
    except BaseException:
        collector.close()
        raise
    finally:
        os.close(root_fd)
    return collector.finish()


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "unknown file type"


def _stat_key(info: os.stat_result) -> str:
    return f"{info.st_ino}:{info.st_size}:{info.st_mtime_ns}:{info.st_ctime_ns}"


def _listing(fd: int) -> list[bytes]:
    return sorted(os.fsencode(name) for name in os.listdir(fd))


WalkItem = tuple[bytes, int, bytes, os.stat_result | OSError]


def _walk(root_fd: int, root_name: str) -> Iterator[WalkItem]:
    """(relative path, parent directory fd, name, lstat or error) of every entry below root_fd:
    sorted, depth first, iteratively (a tree 10,000 levels deep costs no stack).

    Each directory is opened relative to its parent's descriptor with ``O_NOFOLLOW |
    O_DIRECTORY``, and each entry is read relative to its directory's descriptor, so a directory
    swapped for a symlink while the walk runs is refused (recorded as unreadable), never
    followed. The parent fd stays open until the caller asks for the next item. Directories
    whose path is already too long to keep are not entered (they are skipped by `admit`).
    """
    try:
        names = _listing(root_fd)
    except OSError as exc:
        raise CaptureError(f"cannot list {root_name}: {exc.strerror}") from exc
    stack: list[tuple[int, bytes, Iterator[bytes]]] = [(root_fd, b"", iter(names))]
    try:
        while stack:
            fd, rel, pending = stack[-1]
            name = next(pending, None)
            if name is None:
                stack.pop()
                if fd != root_fd:
                    os.close(fd)
                continue
            child = rel + b"/" + name if rel else name
            try:
                info: os.stat_result = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                yield child, fd, name, exc
                continue
            if not stat.S_ISDIR(info.st_mode) or _too_long(child):
                yield child, fd, name, info
                continue
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:  # replaced by a link or a file since listed, or out of fds
                yield child, fd, name, exc
                continue
            try:
                info = os.fstat(sub)
                listing = _listing(sub)
            except OSError as exc:
                os.close(sub)
                yield child, fd, name, info
                yield child, fd, name, exc
                continue
            stack.append((sub, child, iter(listing)))
            yield child, fd, name, info
    finally:
        for fd, _, _ in stack:
            if fd != root_fd:
                os.close(fd)


def _capture_file(
    collector: _Collector,
    parent: int,
    name: bytes,
    key: bytes,
    display: str,
    info: os.stat_result,
    raw_b64: str | None,
    before: Entry | None,
) -> None:
    limit = collector.limits.max_file_bytes
    mode = stat.S_IMODE(info.st_mode)
    if info.st_size > limit:
        collector.skip(display, "too_large", info.st_size)
        return
    stat_key = _stat_key(info)
    if (
        before is not None
        and before.stat_key == stat_key
        and before.sha256
        and collector.has_blob(before.sha256)
    ):
        collector.reused += 1
        same = before.mode == mode and before.raw_name == raw_b64
        collector.keep(key, before if same else before.model_copy(update={"mode": mode}))
        return
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
    except OSError as exc:
        collector.skip(display, "unreadable", info.st_size, exc.strerror or str(exc))
        return
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            collector.skip(display, "special_file", 0, "replaced by a non-file while read")
            return
        buffer = io.BytesIO()
        while chunk := os.read(fd, CHUNK):
            buffer.write(chunk)
            if buffer.tell() > limit:
                collector.skip(
                    display, "too_large", buffer.tell(), "grew past the limit while read"
                )
                return
        after = os.fstat(fd)
    except OSError as exc:
        collector.skip(display, "unreadable", info.st_size, exc.strerror or str(exc))
        return
    finally:
        os.close(fd)
    data = buffer.getvalue()
    changed = (after.st_size, after.st_mtime_ns) != (opened.st_size, opened.st_mtime_ns) or len(
        data
    ) != opened.st_size
    collector.keep(
        key,
        Entry(
            path=display,
            type="file",
            size=len(data),
            mode=mode,
            mtime=opened.st_mtime,
            sha256=collector.put(data),
            raw_name=raw_b64,
            changed_while_read=changed,
            # A file that changed while read is hashed again next time.
            stat_key=None if changed else _stat_key(after),
        ),
    )


# -- capture from a listing hashed where the files are -------------------------------------------


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
    in the other captures (same `_Collector`), so the manifest is the same kind.

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
        self.collector = _Collector(store, limits or Limits(), source)
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
        for row in _previous_rows(self.collector.spool.db, self.store, self.previous):
            if rows is not None and (row[1] or row[2]):
                rows.append(row)
                if len(rows) > PREVIOUS_ROWS_HELD:
                    rows = None
            if row[2]:
                yield row[0], row[1], row[3], row[2]
        self.rows = rows

    def prepare(self) -> None:
        """Index the previous manifest and check which of its files lost their blob
        (`_Collector.load_previous`, `_Collector.check_previous_blobs`); once."""
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
        `_Collector.keep_unchanged`), fetch what the store lacks, store the manifest."""
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
    collector: _Collector,
    listing: Iterable[Listed],
    fetch: Fetch,
    unchanged: Callable[[], bytes] | None = None,
) -> None:
    for item in listing:
        raw = base64.b64decode(item.raw)
        cleaned = _clean(raw)
        display, raw_b64 = _decode_name(raw if cleaned is None else cleaned)
        if item.kind == "error":
            collector.skip(display, "unreadable", item.size, item.detail)
            continue
        key = collector.admit(cleaned, display, item.size)
        if key is None:
            continue
        mode = item.mode & 0o7777
        if item.kind == "dir":
            collector.keep(key, _dir_entry(display, raw_b64, mode, item.mtime))
        elif item.kind == "symlink":
            link = base64.b64decode(item.target or "")
            collector.keep(key, _symlink_entry(display, raw_b64, mode, item.mtime, link))
        elif item.kind == "other":
            collector.skip(display, "special_file", 0, item.detail)
        else:
            _collect_listed_file(collector, key, item)
    if unchanged is not None:
        collector.keep_unchanged(unchanged())
    _fetch_wanted(collector, fetch)


def _collect_listed_file(collector: _Collector, key: bytes, item: Listed) -> None:
    """One listed file, admitted as `key`, judged on its own."""
    display, raw_b64 = _decode_name(key)
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


class _BlobWrites:
    """The fetched files' new blobs: each is written to a temporary file here (`BlobStore.stage`)
    and synced and renamed by a pool (`BlobStore.commit`), so that only the waits on the disk
    overlap. The pool's threads run almost no Python: with whole writes in the pool, the
    threads taking turns with the one reading the fetched files made every call here that
    gives up the interpreter lock (a stat, a hash) wait to get it back, and a capture of 200
    small changed files spent 0.2 s on them. At most `WRITE_AHEAD_BYTES` wait to be synced;
    `close` returns once all are stored (the manifest, written after, never names a blob not
    yet stored)."""

    def __init__(self, collector: _Collector) -> None:
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


def _fetch_wanted(collector: _Collector, fetch: Fetch) -> None:
    keys = collector.wanted_keys()
    if not keys:
        return
    writes = _BlobWrites(collector)
    try:
        _fetch_into(collector, fetch, keys, writes)
    finally:
        try:
            writes.close()
        except OSError as exc:
            raise CaptureError(f"storing fetched files failed: {exc}") from exc


def _fetch_into(
    collector: _Collector, fetch: Fetch, keys: list[bytes], writes: _BlobWrites
) -> None:
    limit = collector.limits.max_file_bytes
    for stream in fetch(keys):
        batch = _FetchBatch(collector, writes)
        try:
            with tarfile.open(
                fileobj=stream, mode="r|*", encoding="utf-8", errors="surrogateescape"
            ) as archive:
                for member in archive:
                    key = _clean(_raw_name(member.name))
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

    def __init__(self, collector: _Collector, writes: _BlobWrites) -> None:
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


# -- reading snapshots back ----------------------------------------------------------------------


def load_manifest(store: BlobStore, digest: str) -> Manifest:
    """The whole manifest, its parts joined (see `Manifest`)."""
    manifest = Manifest.model_validate_json(store.get_bytes(digest))
    if manifest.parts or manifest.skipped_parts:
        manifest.entries = list(iter_entries(store, manifest))
        manifest.skipped = [
            s
            for part in manifest.skipped_parts
            for s in _SkippedPart.model_validate_json(store.get_bytes(part)).skipped
        ]
    return manifest


def iter_entries(store: BlobStore, manifest: Manifest | str) -> Iterator[Entry]:
    """A manifest's entries in key order, one part in memory at a time (given its digest)."""
    head = (
        Manifest.model_validate_json(store.get_bytes(manifest))
        if isinstance(manifest, str)
        else manifest
    )
    if not head.parts:
        yield from head.entries
        return
    for part in head.parts:
        yield from _EntryPart.model_validate_json(store.get_bytes(part)).entries


def export_tar(
    store: BlobStore, manifest: Manifest, out: BinaryIO, gzip: bool = True, root: str = EXPORT_ROOT
) -> None:
    """Write the snapshot as a tar (gzip by default) with everything under ``root/``.

    This is PaperBench's submission layout: ``submission.tar.gz`` holding ``submission/...``.
    Names and link targets are the captured bytes; permissions only (no setuid/setgid/sticky);
    every member owned by the unprivileged `EXPORT_UID`. A global header names the layout policy
    that chose what the snapshot kept (``BASELINE.export_policy``) and the ignored folders.
    """
    mode: Literal["w:gz", "w"] = "w:gz" if gzip else "w"
    policy = {
        "BASELINE.export_policy": manifest.limits.policy,
        "BASELINE.ignored": ",".join(manifest.limits.ignore),
    }
    with tarfile.open(
        fileobj=out,
        mode=mode,
        format=tarfile.PAX_FORMAT,
        encoding="utf-8",
        errors="surrogateescape",
        pax_headers=policy,
    ) as archive:

        def member(name: str, kind: bytes, mode: int, mtime: float) -> tarfile.TarInfo:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = kind, mode & PERMISSION_BITS, int(mtime)
            info.uid, info.gid, info.uname, info.gname = EXPORT_UID, EXPORT_GID, "", ""
            return info

        archive.addfile(member(root, tarfile.DIRTYPE, 0o755, manifest.created_at.timestamp()))
        for entry in sorted(manifest.entries, key=lambda e: e.key):
            name = root + "/" + entry.key.decode("utf-8", "surrogateescape")
            if entry.type == "dir":
                archive.addfile(member(name, tarfile.DIRTYPE, entry.mode, entry.mtime))
            elif entry.type == "symlink":
                info = member(name, tarfile.SYMTYPE, entry.mode, entry.mtime)
                info.linkname = entry.target_bytes.decode("utf-8", "surrogateescape")
                archive.addfile(info)
            else:
                assert entry.sha256 is not None
                info = member(name, tarfile.REGTYPE, entry.mode, entry.mtime)
                info.size = entry.size
                with store.open(entry.sha256) as blob:
                    archive.addfile(info, blob)


class _DirChain:
    """The directories along the current path below a restore's destination, each opened
    relative to its parent with ``O_NOFOLLOW``: no path string is resolved, however long, and a
    symlink is never walked through. Sorted entries reuse the common prefix."""

    def __init__(self, base_fd: int) -> None:
        self.base = base_fd
        self.parts: list[bytes] = []
        self.fds: list[int] = []

    def open(self, parts: list[bytes]) -> int:
        common = 0
        while common < min(len(parts), len(self.parts)) and parts[common] == self.parts[common]:
            common += 1
        for fd in self.fds[common:]:
            os.close(fd)
        del self.fds[common:], self.parts[common:]
        for part in parts[common:]:
            parent = self.fds[-1] if self.fds else self.base
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=parent)
            self.fds.append(os.open(part, _DIR_FLAGS, dir_fd=parent))
            self.parts.append(part)
        return self.fds[-1] if self.fds else self.base

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds, self.parts = [], []


def restore_directory(store: BlobStore, manifest: Manifest, dest: Path) -> list[Skipped]:
    """Recreate the snapshot under an empty ``dest``: directories, files, then symlinks last.

    Names and link targets are restored byte for byte; modes lose setuid/setgid/sticky. Paths
    were cleaned at capture and nothing is written under a symlink (every level is opened
    without following links), so nothing escapes. An entry the file system cannot hold (a name
    over its limit, from a manifest older than that check) is returned, not raised.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    for entry in manifest.entries:
        if _clean(entry.key) != entry.key:
            raise ValueError(f"manifest holds an unsafe path: {entry.path!r}")
    not_restored: list[Skipped] = []
    base = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    chain = _DirChain(base)
    try:
        ordered = sorted(manifest.entries, key=lambda e: (e.type == "symlink", e.key))
        for entry in ordered:
            *parents, name = entry.key.split(b"/")
            try:
                _restore_entry(store, entry, chain.open(parents), name)
            except OSError as exc:
                if exc.errno != errno.ENAMETOOLONG:
                    raise
                not_restored.append(
                    Skipped(path=entry.path, reason="path_too_long", detail=exc.strerror or "")
                )
        for entry in manifest.entries:
            if entry.type == "dir" and _clean(entry.key):
                try:
                    fd = chain.open(entry.key.split(b"/"))
                except OSError as exc:
                    if exc.errno != errno.ENAMETOOLONG:
                        raise
                    continue
                os.fchmod(fd, (entry.mode & PERMISSION_BITS) | 0o700)
    finally:
        chain.close()
        os.close(base)
    return not_restored


def _restore_entry(store: BlobStore, entry: Entry, parent: int, name: bytes) -> None:
    if entry.type == "dir":
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
    elif entry.type == "symlink":
        os.symlink(entry.target_bytes, name, dir_fd=parent)
    else:
        assert entry.sha256 is not None
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=parent)
        with os.fdopen(fd, "wb") as out, store.open(entry.sha256) as blob:
            while chunk := blob.read(CHUNK):
                out.write(chunk)
            out.flush()
            os.fchmod(fd, entry.mode & PERMISSION_BITS)
            os.utime(fd, (entry.mtime, entry.mtime))


class Problem(BaseModel):
    path: str
    detail: str


def verify(store: BlobStore, digest: str, checked: dict[str, bool] | None = None) -> list[Problem]:
    """Re-hash the manifest, its parts and every file blob it names; [] means the snapshot is
    intact. Entries are read one part at a time.

    ``checked`` caches blob results across snapshots that share blobs within one run.
    """
    cache = checked if checked is not None else {}

    def ok(blob: str) -> bool:
        if blob not in cache:
            cache[blob] = store.verify(blob)
        return cache[blob]

    if not ok(digest):
        return [Problem(path="(manifest)", detail=f"manifest blob {digest} is missing or corrupt")]
    try:
        head = Manifest.model_validate_json(store.get_bytes(digest))
    except ValueError as exc:
        return [Problem(path="(manifest)", detail=f"manifest does not parse: {exc}")]
    broken = [p for p in head.parts + head.skipped_parts if not ok(p)]
    if broken:
        return [
            Problem(path="(manifest)", detail=f"part {p} is missing or corrupt") for p in broken
        ]
    problems = []
    try:
        for entry in iter_entries(store, head):
            if entry.type != "file":
                continue
            if entry.sha256 is None or not ok(entry.sha256):
                problems.append(
                    Problem(path=entry.path, detail=f"blob {entry.sha256} missing or corrupt")
                )
            elif store.path(entry.sha256).stat().st_size != entry.size:
                problems.append(
                    Problem(path=entry.path, detail="blob size differs from the manifest")
                )
    except ValueError as exc:
        return [Problem(path="(manifest)", detail=f"a manifest part does not parse: {exc}")]
    return problems


def count_files(store: BlobStore, digest: str) -> int:
    """How many files a snapshot keeps, counted part by part."""
    return sum(1 for e in iter_entries(store, digest) if e.type == "file")


class Diff(BaseModel):
    added: list[str]
    removed: list[str]
    changed: list[str]

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


def diff(old: Manifest, new: Manifest) -> Diff:
    """File-level difference: content, type, mode or link target changed."""
    a, b = old.by_key(), new.by_key()

    def signature(e: Entry) -> tuple[object, ...]:
        return (e.type, e.sha256, e.mode, e.target_bytes)

    def shown(keys: Iterable[bytes], side: dict[bytes, Entry]) -> list[str]:
        return [side[k].path for k in sorted(keys)]

    return Diff(
        added=shown(set(b) - set(a), b),
        removed=shown(set(a) - set(b), a),
        changed=shown((k for k in set(a) & set(b) if signature(a[k]) != signature(b[k])), b),
    )
