"""Capture from a directory (the persisted submission volume of a dead workspace), walked
level by level relative to each parent's descriptor with O_NOFOLLOW."""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator
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

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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
    collector = Collector(store, limits or Limits(), source)
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
            stack.append((sub, child, iter(listing)))
            yield child, fd, name, info
    finally:
        for fd, _, _ in stack:
            if fd != root_fd:
                os.close(fd)


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
