"""Capture from a directory (the persisted submission volume of a dead workspace), walked
level by level relative to each parent's descriptor with O_NOFOLLOW."""

from __future__ import annotations

import errno
import heapq
import io
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from infra.blobs import CHUNK, BlobStore
from infra.snapshots.collector import (
    DIR_FLAGS,
    Collector,
    decode_name,
    dir_entry,
    symlink_entry,
    too_long,
)
from infra.snapshots.manifest import CaptureError, CaptureResult, Entry, Limits, Manifest

# Directories of the walked path held open at once; deeper ones are closed and opened again.
FD_WINDOW = 32
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Names of one directory held in memory at once: a larger directory is sorted in runs of this
# many, spilled to a temporary file and merged (200,000 names of 250 bytes held whole took
# 154 MB; a participant decides how many names a directory has).
LISTING_RUN_NAMES = 20_000
_RUN_READ_BYTES = 64 * 1024


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

    A file with several hard links is read only once the walk has found all of them inside the
    tree (`_Linked`): a link to a file elsewhere on the same filesystem would otherwise put a
    file the tree does not hold into the snapshot; such a file is skipped as ``hardlink``.
    """
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise CaptureError(f"{root} is not a readable directory: {exc.strerror}") from exc
    collector = Collector(store, limits or Limits(), source)
    linked = _Linked(collector)
    try:
        if previous is not None:
            collector.load_previous(store, previous)
        for raw_rel, parent, name, info in _walk(root_fd, os.fspath(root)):
            display, raw_b64 = decode_name(raw_rel)
            if isinstance(info, OSError):
                collector.skip(display, "unreadable", 0, info.strerror or str(info))
                continue
            key = collector.admit(raw_rel, display, info.st_size)
            if key is None:
                continue
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISDIR(info.st_mode):
                collector.keep(key, dir_entry(display, raw_b64, mode, info.st_mtime))
            elif stat.S_ISLNK(info.st_mode):
                try:
                    link = os.readlink(name, dir_fd=parent)
                except OSError as exc:
                    collector.skip(display, "unreadable", 0, exc.strerror or str(exc))
                    continue
                collector.keep(key, symlink_entry(display, raw_b64, mode, info.st_mtime, link))
            elif stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                linked.defer(raw_rel, key, info)
            elif stat.S_ISREG(info.st_mode):
                before = collector.previous(key) if previous is not None else None
                _capture_file(collector, parent, name, key, display, info, raw_b64, before)
            else:
                collector.skip(display, "special_file", 0, _file_kind(info.st_mode))
        linked.capture(root_fd, previous is not None)
    except BaseException:
        collector.close()
        raise
    finally:
        os.close(root_fd)
    return collector.finish()


class _Linked:
    """Files with more than one hard link, held back until the walk is over (in the capture's
    spool, not in memory): each is read when the walk found as many links to its inode as it
    has, else skipped as ``hardlink`` (one of its links is outside the tree)."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.db = collector.spool.db
        self.db.execute(
            "CREATE TABLE linked (key BLOB PRIMARY KEY, rel BLOB, dev INTEGER, ino INTEGER, "
            "nlink INTEGER)"
        )

    def defer(self, rel: bytes, key: bytes, info: os.stat_result) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO linked VALUES (?, ?, ?, ?, ?)",
            (key, rel, info.st_dev, info.st_ino, info.st_nlink),
        )

    def capture(self, root_fd: int, incremental: bool) -> None:
        rows = self.db.execute(
            "SELECT l.key, l.rel, l.dev, l.ino, g.links, g.nlink FROM linked l JOIN "
            "(SELECT dev, ino, COUNT(*) AS links, MAX(nlink) AS nlink FROM linked "
            "GROUP BY dev, ino) g ON g.dev = l.dev AND g.ino = l.ino ORDER BY l.key"
        ).fetchall()
        for key, rel, dev, ino, links, nlink in rows:
            display, raw_b64 = decode_name(key)
            if links < nlink:
                self.collector.skip(
                    display,
                    "hardlink",
                    0,
                    f"a hard link to a file outside the submission ({links} of its {nlink} "
                    "links are inside)",
                )
                continue
            try:
                parent, name = _open_parent(root_fd, rel)
            except OSError as exc:
                self.collector.skip(display, "unreadable", 0, exc.strerror or str(exc))
                continue
            try:
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if (info.st_dev, info.st_ino) != (dev, ino) or info.st_nlink != nlink:
                    self.collector.skip(
                        display, "changed_while_read", info.st_size, "its links changed"
                    )
                    continue
                before = self.collector.previous(key) if incremental else None
                _capture_file(self.collector, parent, name, key, display, info, raw_b64, before)
            except OSError as exc:
                self.collector.skip(display, "unreadable", 0, exc.strerror or str(exc))
            finally:
                if parent != root_fd:
                    os.close(parent)


def _open_parent(root_fd: int, rel: bytes) -> tuple[int, bytes]:
    """The directory holding `rel` (opened level by level from the root, never through a link)
    and the name in it; the root's own descriptor for a top-level name (not to be closed)."""
    *folders, name = rel.split(b"/")
    fd = root_fd
    try:
        for folder in folders:
            opened = os.open(folder, DIR_FLAGS, dir_fd=fd)
            if fd != root_fd:
                os.close(fd)
            fd = opened
    except BaseException:
        if fd != root_fd:
            os.close(fd)
        raise
    return fd, name


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


def _listing(fd: int) -> Iterator[bytes]:
    """A directory's names in byte order, never more than `LISTING_RUN_NAMES` of them in memory:
    a larger directory is read as sorted runs written to a temporary file (one descriptor,
    closed once the merge is done), merged as the walk consumes it. Raises OSError as listdir
    does, before anything is yielded."""
    run: list[bytes] = []
    spill: _Runs | None = None
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                run.append(os.fsencode(entry.name))
                if len(run) == LISTING_RUN_NAMES:
                    spill = spill or _Runs()
                    spill.write(sorted(run))
                    run.clear()
    except BaseException:
        if spill is not None:
            spill.close()
        raise
    if spill is None:
        return iter(sorted(run))
    if run:
        spill.write(sorted(run))
    return spill.merged()


class _Runs:
    """Sorted runs of names in one temporary file (each name length-prefixed), read back by
    offset (`os.pread`), a block per run at a time."""

    def __init__(self) -> None:
        # Closed by `close` (when the merge ends), not by a with: it outlives this call.
        self.file = tempfile.TemporaryFile(prefix="baseline-listing-")  # noqa: SIM115
        self.bounds: list[tuple[int, int]] = []  # (start, end) offset of each run

    def write(self, names: list[bytes]) -> None:
        start = self.file.tell()
        self.file.write(b"".join(len(name).to_bytes(2, "big") + name for name in names))
        self.bounds.append((start, self.file.tell()))

    def merged(self) -> Iterator[bytes]:
        self.file.flush()
        try:
            yield from heapq.merge(*(self._run(start, end) for start, end in self.bounds))
        finally:
            self.close()

    def _run(self, offset: int, end: int) -> Iterator[bytes]:
        buffer, at = b"", 0
        while True:
            if len(buffer) - at >= 2:
                size = int.from_bytes(buffer[at : at + 2], "big")
                if len(buffer) - at >= 2 + size:
                    yield buffer[at + 2 : at + 2 + size]
                    at += 2 + size
                    continue
            if offset >= end:
                if at < len(buffer):
                    raise OSError(errno.EIO, "a listing run was cut short")
                return
            block = os.pread(self.file.fileno(), min(_RUN_READ_BYTES, end - offset), offset)
            if not block:
                raise OSError(errno.EIO, "a listing run was cut short")
            offset += len(block)
            buffer, at = buffer[at:] + block, 0

    def close(self) -> None:
        self.file.close()


WalkItem = tuple[bytes, int, bytes, os.stat_result | OSError]


@dataclass
class _Level:
    """A directory on the walk's current path: its descriptor while open (see `FD_WINDOW`), its
    identity to check a reopening against, and the names of it still to visit."""

    fd: int | None
    rel: bytes
    name: bytes
    ident: tuple[int, int]
    pending: Iterator[bytes]


def _walk(root_fd: int, root_name: str) -> Iterator[WalkItem]:
    """(relative path, parent directory fd, name, lstat or error) of every entry below root_fd:
    sorted, depth first, iteratively (a tree 10,000 levels deep costs no stack).

    Each directory is opened relative to its parent's descriptor with ``O_NOFOLLOW |
    O_DIRECTORY``, and each entry is read relative to its directory's descriptor, so a directory
    swapped for a symlink while the walk runs is refused (recorded as unreadable), never
    followed. The parent fd stays open until the caller asks for the next item. Directories
    whose path is already too long to keep are not entered (they are skipped by `admit`).

    At most `FD_WINDOW` directories of the current path are held open (a participant's tree
    2,000 levels deep would otherwise exhaust the process's descriptors, failing this capture
    and every other thread's files): a directory closed on the way down is opened again, level
    by level from the nearest open one, when the walk comes back to it, and it must be the same
    directory (device and inode) or the rest of it is recorded as unreadable.
    """
    try:
        names = _listing(root_fd)
        root_info = os.fstat(root_fd)
    except OSError as exc:
        raise CaptureError(f"cannot list {root_name}: {exc.strerror}") from exc
    stack = [_Level(root_fd, b"", b"", (root_info.st_dev, root_info.st_ino), names)]
    try:
        while stack:
            level = stack[-1]
            name = next(level.pending, None)
            if name is None:
                stack.pop()
                if level.fd is not None and level.fd != root_fd:
                    os.close(level.fd)
                continue
            if level.fd is None:
                try:
                    _reopen(stack)
                except OSError as exc:
                    stack.pop()
                    yield level.rel, root_fd, level.name, exc
                    continue
            fd = level.fd
            assert fd is not None
            child = level.rel + b"/" + name if level.rel else name
            try:
                info: os.stat_result = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                yield child, fd, name, exc
                continue
            if not stat.S_ISDIR(info.st_mode) or too_long(child):
                yield child, fd, name, info
                continue
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
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
            stack.append(_Level(sub, child, name, (info.st_dev, info.st_ino), listing))
            _close_above_window(stack)
            yield child, fd, name, info
    finally:
        for level in stack:
            if level.fd is not None and level.fd != root_fd:
                os.close(level.fd)


def _close_above_window(stack: list[_Level]) -> None:
    """Close the shallowest open directories (never the root, nor the last two: the current
    directory and its parent, which the caller reads from) until `FD_WINDOW` are open."""
    open_levels = [level for level in stack[1:-2] if level.fd is not None]
    excess = sum(1 for level in stack if level.fd is not None) - FD_WINDOW
    for level in open_levels[: max(0, excess)]:
        assert level.fd is not None
        os.close(level.fd)
        level.fd = None


def _reopen(stack: list[_Level]) -> None:
    """Open the last level again from the nearest open one above it, each level relative to its
    parent without following links; OSError when a level is no longer the directory walked."""
    start = max(index for index, level in enumerate(stack) if level.fd is not None)
    for index in range(start + 1, len(stack)):
        level, above = stack[index], stack[index - 1]
        assert above.fd is not None
        fd = os.open(level.name, DIR_FLAGS, dir_fd=above.fd)
        if index - 1 > start:  # a level opened on the way down: not kept
            os.close(above.fd)
            above.fd = None
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != level.ident:
            os.close(fd)
            raise OSError(errno.ESTALE, "the directory was replaced while it was read")
        level.fd = fd
    _close_above_window(stack)


def _capture_file(
    collector: Collector,
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
    collector.keep_content(
        key,
        display,
        data,
        mode,
        opened.st_mtime,
        raw_b64,
        changed_while_read=changed,
        # A file that changed while read is hashed again next time.
        stat_key=None if changed else _stat_key(after),
    )
