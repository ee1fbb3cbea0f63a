"""Capture from a tar stream: what every workspace backend returns for /home/submission."""

from __future__ import annotations

import io
import tarfile
import zlib
from collections.abc import Callable, Iterable
from typing import BinaryIO, cast

from infra.blobs import CHUNK, BlobStore
from infra.snapshots.collector import (
    Collector,
    clean_name,
    decode_name,
    dir_entry,
    member_name_bytes,
    symlink_entry,
)
from infra.snapshots.manifest import (
    EXPORT_ROOT,
    ArchiveTruncated,
    CaptureError,
    CaptureResult,
    Limits,
)
from infra.workspace import WorkspaceBackend, WorkspaceHandle

# Reads of a live workspace's archive: a member that changes while the engine sends it ends the
# stream; the capture is read again this many times in all before keeping what arrived.
ARCHIVE_PASSES = 3

MEMBER_READ = 64 * 1024


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
    collector = Collector(store, limits or Limits(), source)
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
        collector = Collector(store, limits or Limits(), source)
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


def _keep_partial(collector: Collector, exc: ArchiveTruncated) -> None:
    member = exc.member
    _, raw_b64 = decode_name(exc.key)
    if exc.kept:  # a file passed over (too large, ignored) keeps the record it already has
        collector.keep_content(
            exc.key,
            exc.display,
            exc.partial,
            member.mode & 0o7777,
            member.mtime,
            raw_b64,
            changed_while_read=True,
        )
    collector.skip(
        exc.display,
        "changed_while_read",
        member.size,
        f"the archive ended inside this file in {ARCHIVE_PASSES} reads; "
        "members sent after it are missing",
    )


def _read_archive(collector: Collector, stream: BinaryIO, root: str | None) -> None:
    root_raw = root.encode() if root else None
    try:
        with tarfile.open(
            fileobj=stream, mode="r|*", encoding="utf-8", errors="surrogateescape"
        ) as archive:
            members = iter(archive)
            passed: tarfile.TarInfo | None = None  # the last member whose data was not read
            while True:
                try:
                    member = next(members, None)
                except (tarfile.ReadError, EOFError) as exc:
                    # Ended inside content passed over unread (a file over the limit, an
                    # ignored one): the sender gave up on it as on a file being read.
                    if passed is None:
                        raise
                    key = clean_name(_strip_root(member_name_bytes(passed.name), root_raw))
                    display, _ = decode_name(key or member_name_bytes(passed.name))
                    raise ArchiveTruncated(key or b"", display, b"", passed, kept=False) from exc
                if member is None:
                    return
                read = _capture_member(collector, archive, member, root_raw)
                passed = member if member.isfile() and member.size and not read else None
    except ArchiveTruncated:
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise CaptureError(f"the archive could not be read to its end: {exc}") from exc


def _capture_member(
    collector: Collector, archive: tarfile.TarFile, member: tarfile.TarInfo, root: bytes | None
) -> bool:
    """Judge one member; whether its content was read (a file's data left unread is passed
    over when the next member is asked for)."""
    original = member_name_bytes(member.name)
    cleaned = clean_name(_strip_root(original, root))
    display, raw_b64 = decode_name(original if cleaned is None else cleaned)
    key = collector.admit(cleaned, display, member.size)
    if key is None:
        return False
    mode = member.mode & 0o7777
    if member.isdir():
        collector.keep(key, dir_entry(display, raw_b64, mode, member.mtime))
    elif member.issym():
        link = member_name_bytes(member.linkname)
        collector.keep(key, symlink_entry(display, raw_b64, mode, member.mtime, link))
    elif member.islnk():
        _capture_hardlink(collector, member, key, display, raw_b64, root)
    elif member.isfile():
        # Decided from the header: the content of a file over the limit is passed over in
        # fixed-size reads, never held.
        if member.size > collector.limits.max_file_bytes:
            collector.skip(display, "too_large", member.size)
            return False
        handle = archive.extractfile(member)
        if handle is None:
            collector.skip(display, "unreadable", member.size, "no data in the archive")
            return False
        data = bytearray()
        try:
            # Modest reads: when the stream ends inside the file, what came whole is kept.
            while chunk := handle.read(MEMBER_READ):
                data += chunk
        except (tarfile.ReadError, EOFError) as exc:
            raise ArchiveTruncated(key, display, bytes(data), member) from exc
        if len(data) != member.size:
            raise ArchiveTruncated(key, display, bytes(data), member)
        collector.keep_content(key, display, bytes(data), mode, member.mtime, raw_b64)
        return True
    else:
        kind = {
            tarfile.FIFOTYPE: "fifo",
            tarfile.CHRTYPE: "character device",
            tarfile.BLKTYPE: "block device",
        }.get(member.type, f"tar type {member.type!r}")
        collector.skip(display, "special_file", 0, kind)
    return False


def _capture_hardlink(
    collector: Collector,
    member: tarfile.TarInfo,
    key: bytes,
    display: str,
    raw_b64: str | None,
    root: bytes | None,
) -> None:
    """A hard link names an earlier member; it is kept as a copy of that file when it is one."""
    target_raw = member_name_bytes(member.linkname)
    target = clean_name(_strip_root(target_raw, root))
    original = collector.get(target) if target else None
    if original is None or original.type != "file":
        target_name, _ = decode_name(target_raw)
        collector.skip(display, "hardlink", 0, f"link to {target_name!r}, not a kept file")
        return
    collector.keep(key, original.model_copy(update={"path": display, "raw_name": raw_b64}))
