"""Snapshot capture into the content-addressed blob store, and export, restore, verify and diff.

A snapshot is a manifest (one entry per kept path: size, mode, sha256, mtime; symlinks with their
target) stored as a blob itself, so one digest names a whole snapshot. File contents are blobs, so
identical files are stored once across all snapshots of all attempts.

Captures read a tar stream (what every workspace backend returns for /home/submission) or walk a
directory (the persisted submission volume of a dead workspace). Nothing is ever extracted: paths
that would escape (``..``, absolute names, names under a symlink), links, FIFOs and devices,
unreadable or oversized files, ignored folders (virtual environments, caches) are recorded in the
manifest's ``skipped`` list with the reason and size, never followed, never written.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import io
import os
import re
import stat
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Literal

from pydantic import BaseModel, Field

from infra.blobs import CHUNK, BlobStore

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

SkipReason = Literal[
    "ignored",
    "too_large",
    "unsafe_path",
    "special_file",
    "unreadable",
    "hardlink",
    "duplicate",
]


class CaptureError(Exception):
    """The source could not be read as a whole (broken or truncated archive); nothing is kept."""


class Entry(BaseModel):
    """One kept path. ``raw_name`` (base64) is set only when the name is not valid UTF-8."""

    path: str
    type: Literal["file", "dir", "symlink"]
    size: int = 0
    mode: int = 0o644
    sha256: str | None = None
    mtime: float = 0.0
    target: str | None = None
    raw_name: str | None = None
    changed_while_read: bool = False
    # Directory captures only: (inode, size, mtime_ns, ctime_ns), to reuse hashes next time.
    stat_key: str | None = None


class Skipped(BaseModel):
    path: str
    reason: SkipReason
    size: int = 0
    count: int = 1
    detail: str = ""


class Limits(BaseModel):
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    ignore: tuple[str, ...] = DEFAULT_IGNORE


class Manifest(BaseModel):
    version: int = 1
    source: str = ""
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    limits: Limits = Field(default_factory=Limits)
    entries: list[Entry] = Field(default_factory=list)
    skipped: list[Skipped] = Field(default_factory=list)

    @property
    def files(self) -> list[Entry]:
        return [e for e in self.entries if e.type == "file"]

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files)

    def by_path(self) -> dict[str, Entry]:
        return {e.path: e for e in self.entries}


class CaptureResult(BaseModel):
    manifest: Manifest
    manifest_sha256: str
    new_blobs: int
    reused_hashes: int = 0

    @property
    def file_count(self) -> int:
        return len(self.manifest.files)


# -- names ---------------------------------------------------------------------------------------


def _decode_name(raw: bytes) -> tuple[str, str | None]:
    """A printable name, and the original bytes (base64) when they are not UTF-8."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace"), base64.b64encode(raw).decode()


def _clean(name: str) -> str | None:
    """A relative POSIX path with no ``.``/``..``/empty parts, or None when it would escape."""
    if name.startswith("/") or "\x00" in name:
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return None
    return "/".join(parts)


class _Collector:
    """Shared bookkeeping of a capture: kept entries, skipped paths, ignored folders summed."""

    def __init__(self, store: BlobStore, limits: Limits, source: str) -> None:
        self.store = store
        self.limits = limits
        self.manifest = Manifest(source=source, limits=limits)
        self.kept: dict[str, Entry] = {}
        self.symlinks: set[str] = set()
        self.ignored: dict[str, Skipped] = {}
        self.new_blobs = 0
        self.new_dirs: set[Path] = set()
        self.reused = 0
        patterns = [fnmatch.translate(p) for p in limits.ignore]
        self.ignore_re = re.compile("|".join(patterns)) if patterns else None
        self.blob_root = os.fspath(store.root)

    def ignored_prefix(self, path: str) -> str | None:
        parts = path.split("/")
        for index, part in enumerate(parts):
            if self.ignore_re is not None and self.ignore_re.match(part):
                return "/".join(parts[: index + 1])
        return None

    def has_blob(self, digest: str) -> bool:
        """BlobStore.exists without its per-call validation: the hot path of incremental captures
        (the digest comes from a manifest this module wrote)."""
        return os.path.exists(f"{self.blob_root}/{digest[:2]}/{digest[2:4]}/{digest}")

    def under_symlink(self, path: str) -> str | None:
        parts = path.split("/")
        for index in range(1, len(parts)):
            prefix = "/".join(parts[:index])
            if prefix in self.symlinks:
                return prefix
        return None

    def skip(self, path: str, reason: SkipReason, size: int = 0, detail: str = "") -> None:
        self.manifest.skipped.append(Skipped(path=path, reason=reason, size=size, detail=detail))

    def skip_ignored(self, prefix: str, size: int) -> None:
        entry = self.ignored.get(prefix)
        if entry is None:
            self.ignored[prefix] = Skipped(path=prefix, reason="ignored", size=size, count=1)
        else:
            entry.size += size
            entry.count += 1

    def admit(self, path: str | None, display: str, size: int) -> str | None:
        """The cleaned path if this member may be kept, else records why not and returns None."""
        if path is None:
            self.skip(display, "unsafe_path", size, "absolute path or '..' component")
            return None
        if path == "":
            return None
        prefix = self.ignored_prefix(path)
        if prefix is not None:
            self.skip_ignored(prefix, size)
            return None
        link = self.under_symlink(path)
        if link is not None:
            self.skip(path, "unsafe_path", size, f"under the symlink {link}")
            return None
        if path in self.kept:
            self.skip(path, "duplicate", size, "a later archive member repeats this path")
            return None
        return path

    def keep(self, entry: Entry) -> None:
        self.kept[entry.path] = entry
        if entry.type == "symlink":
            self.symlinks.add(entry.path)

    def put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if not self.store.exists(digest):
            self.store.put_bytes(data)
            self.new_blobs += 1
            self.new_dirs.add(self.store.path(digest).parent)
        return digest

    def finish(self) -> CaptureResult:
        self.manifest.entries = sorted(self.kept.values(), key=lambda e: e.path)
        self.manifest.skipped.extend(self.ignored.values())
        self.manifest.skipped.sort(key=lambda s: (s.path, s.reason))
        data = self.manifest.model_dump_json().encode()
        digest = self.put(data)
        _fsync_dirs(self.new_dirs)
        return CaptureResult(
            manifest=self.manifest,
            manifest_sha256=digest,
            new_blobs=self.new_blobs,
            reused_hashes=self.reused,
        )


def _fsync_dirs(dirs: Iterable[Path]) -> None:
    """Make the renames of new blobs durable before the database points at them."""
    for directory in dirs:
        try:
            fd = os.open(directory, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# -- capture from a tar stream -------------------------------------------------------------------


def _strip_root(name: str, root: str | None) -> str:
    if root and (name == root or name.startswith(root + "/")):
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
        with tarfile.open(
            fileobj=stream, mode="r|*", encoding="utf-8", errors="surrogateescape"
        ) as archive:
            for member in archive:
                _capture_member(collector, archive, member, root)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise CaptureError(f"the archive could not be read to its end: {exc}") from exc
    return collector.finish()


def _capture_member(
    collector: _Collector, archive: tarfile.TarFile, member: tarfile.TarInfo, root: str | None
) -> None:
    cleaned = _clean(_strip_root(member.name, root))
    display, raw_b64 = _decode_name(member.name.encode("utf-8", "surrogateescape"))
    if cleaned is not None:
        display, raw_b64 = _decode_name(cleaned.encode("utf-8", "surrogateescape"))
    path = collector.admit(None if cleaned is None else display, display, member.size)
    if path is None:
        return
    mode = member.mode & 0o7777
    if member.isdir():
        collector.keep(
            Entry(path=path, type="dir", mode=mode, mtime=member.mtime, raw_name=raw_b64)
        )
    elif member.issym():
        target, _ = _decode_name(member.linkname.encode("utf-8", "surrogateescape"))
        collector.keep(
            Entry(
                path=path,
                type="symlink",
                mode=mode,
                mtime=member.mtime,
                target=target,
                raw_name=raw_b64,
            )
        )
    elif member.islnk():
        _capture_hardlink(collector, member, path, root)
    elif member.isfile():
        if member.size > collector.limits.max_file_bytes:
            collector.skip(path, "too_large", member.size)
            return
        handle = archive.extractfile(member)
        if handle is None:
            collector.skip(path, "unreadable", member.size, "no data in the archive")
            return
        data = handle.read()
        if len(data) != member.size:
            raise CaptureError(f"{path}: archive ended inside the file")
        collector.keep(
            Entry(
                path=path,
                type="file",
                size=len(data),
                mode=mode,
                mtime=member.mtime,
                sha256=collector.put(data),
                raw_name=raw_b64,
            )
        )
    else:
        kind = {
            tarfile.FIFOTYPE: "fifo",
            tarfile.CHRTYPE: "character device",
            tarfile.BLKTYPE: "block device",
        }.get(member.type, f"tar type {member.type!r}")
        collector.skip(path, "special_file", 0, kind)


def _capture_hardlink(
    collector: _Collector, member: tarfile.TarInfo, path: str, root: str | None
) -> None:
    """A hard link names an earlier member; it is kept as a copy of that file when it is one."""
    target_name, _ = _decode_name(member.linkname.encode("utf-8", "surrogateescape"))
    target = _clean(_strip_root(target_name, root))
    original = collector.kept.get(target) if target else None
    if original is None or original.type != "file":
        collector.skip(path, "hardlink", 0, f"link to {target_name!r}, not a kept file")
        return
    collector.keep(original.model_copy(update={"path": path, "raw_name": None}))


# -- capture from a directory --------------------------------------------------------------------


def capture_directory(
    root: Path,
    store: BlobStore,
    limits: Limits | None = None,
    previous: Manifest | None = None,
    source: str = "directory",
) -> CaptureResult:
    """Walk a directory without following links; reuse unchanged files' hashes from ``previous``.

    A file is unchanged when its (inode, size, mtime, ctime) match the previous capture's and its
    blob is present: ctime changes on every write and cannot be set back by a user, so a rewrite
    that restores the mtime is still noticed.
    """
    collector = _Collector(store, limits or Limits(), source)
    known = {e.path: e for e in previous.entries if e.stat_key} if previous else {}
    root = Path(root)
    if not root.is_dir():
        raise CaptureError(f"{root} is not a directory")
    for raw_rel, info in _walk(os.fsencode(root), b""):
        display, raw_b64 = _decode_name(raw_rel)
        if isinstance(info, OSError):
            collector.skip(display, "unreadable", 0, info.strerror or str(info))
            continue
        path = collector.admit(_clean(display), display, info.st_size)
        if path is None:
            continue
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISDIR(info.st_mode):
            collector.keep(
                Entry(path=path, type="dir", mode=mode, mtime=info.st_mtime, raw_name=raw_b64)
            )
        elif stat.S_ISLNK(info.st_mode):
            try:
                target, _ = _decode_name(os.readlink(os.fsencode(root) + b"/" + raw_rel))
            except OSError as exc:
                collector.skip(path, "unreadable", 0, exc.strerror or str(exc))
                continue
            collector.keep(
                Entry(
                    path=path,
                    type="symlink",
                    mode=mode,
                    mtime=info.st_mtime,
                    target=target,
                    raw_name=raw_b64,
                )
            )
        elif stat.S_ISREG(info.st_mode):
            _capture_file(
                collector, os.fsencode(root) + b"/" + raw_rel, path, info, raw_b64, known.get(path)
            )
        else:
            collector.skip(path, "special_file", 0, _file_kind(info.st_mode))
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


def _walk(root: bytes, rel: bytes) -> Iterator[tuple[bytes, os.stat_result | OSError]]:
    """(relative path, lstat) of every entry below root: sorted, depth first, links not followed."""
    here = root + b"/" + rel if rel else root
    try:
        names = sorted(os.listdir(here))
    except OSError as exc:
        if not rel:
            raise CaptureError(f"cannot list {os.fsdecode(root)}: {exc.strerror}") from exc
        yield rel, exc
        return
    for name in names:
        child = rel + b"/" + name if rel else name
        try:
            info = os.lstat(root + b"/" + child)
        except OSError as exc:
            yield child, exc
            continue
        yield child, info
        if stat.S_ISDIR(info.st_mode):
            yield from _walk(root, child)


def _capture_file(
    collector: _Collector,
    full: bytes,
    path: str,
    info: os.stat_result,
    raw_b64: str | None,
    before: Entry | None,
) -> None:
    limit = collector.limits.max_file_bytes
    mode = stat.S_IMODE(info.st_mode)
    if info.st_size > limit:
        collector.skip(path, "too_large", info.st_size)
        return
    key = _stat_key(info)
    if (
        before is not None
        and before.stat_key == key
        and before.sha256
        and collector.has_blob(before.sha256)
    ):
        collector.reused += 1
        same = before.mode == mode and before.raw_name == raw_b64
        collector.keep(before if same else before.model_copy(update={"mode": mode}))
        return
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        collector.skip(path, "unreadable", info.st_size, exc.strerror or str(exc))
        return
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            collector.skip(path, "special_file", 0, "replaced by a non-file while read")
            return
        buffer = io.BytesIO()
        while chunk := os.read(fd, CHUNK):
            buffer.write(chunk)
            if buffer.tell() > limit:
                collector.skip(path, "too_large", buffer.tell(), "grew past the limit while read")
                return
        after = os.fstat(fd)
    except OSError as exc:
        collector.skip(path, "unreadable", info.st_size, exc.strerror or str(exc))
        return
    finally:
        os.close(fd)
    data = buffer.getvalue()
    changed = (after.st_size, after.st_mtime_ns) != (opened.st_size, opened.st_mtime_ns) or len(
        data
    ) != opened.st_size
    collector.keep(
        Entry(
            path=path,
            type="file",
            size=len(data),
            mode=mode,
            mtime=opened.st_mtime,
            sha256=collector.put(data),
            raw_name=raw_b64,
            changed_while_read=changed,
            # A file that changed while read is hashed again next time.
            stat_key=None if changed else _stat_key(after),
        )
    )


# -- reading snapshots back ----------------------------------------------------------------------


def load_manifest(store: BlobStore, digest: str) -> Manifest:
    return Manifest.model_validate_json(store.get_bytes(digest))


def _raw(entry: Entry) -> bytes:
    return base64.b64decode(entry.raw_name) if entry.raw_name else entry.path.encode()


def export_tar(
    store: BlobStore, manifest: Manifest, out: BinaryIO, gzip: bool = True, root: str = EXPORT_ROOT
) -> None:
    """Write the snapshot as a tar (gzip by default) with everything under ``root/``.

    This is PaperBench's submission layout: ``submission.tar.gz`` holding ``submission/...``.
    """
    mode: Literal["w:gz", "w"] = "w:gz" if gzip else "w"
    with tarfile.open(
        fileobj=out,
        mode=mode,
        format=tarfile.PAX_FORMAT,
        encoding="utf-8",
        errors="surrogateescape",
    ) as archive:
        top = tarfile.TarInfo(root)
        top.type, top.mode, top.mtime = tarfile.DIRTYPE, 0o755, int(manifest.created_at.timestamp())
        archive.addfile(top)
        for entry in manifest.entries:
            name = root + "/" + _raw(entry).decode("utf-8", "surrogateescape")
            info = tarfile.TarInfo(name)
            info.mode, info.mtime = entry.mode, int(entry.mtime)
            if entry.type == "dir":
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            elif entry.type == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, entry.target or ""
                archive.addfile(info)
            else:
                assert entry.sha256 is not None
                info.size = entry.size
                with store.open(entry.sha256) as blob:
                    archive.addfile(info, blob)


def restore_directory(store: BlobStore, manifest: Manifest, dest: Path) -> None:
    """Recreate the snapshot under an empty ``dest``: directories, files, then symlinks last.

    Paths were cleaned at capture and nothing is written under a symlink, so nothing escapes.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise FileExistsError(f"{dest} is not empty")
    base = os.fsencode(dest)
    for entry in manifest.entries:
        if _clean(entry.path) != entry.path:
            raise ValueError(f"manifest holds an unsafe path: {entry.path!r}")
    ordered = sorted(manifest.entries, key=lambda e: (e.type == "symlink", e.path))
    for entry in ordered:
        full = base + b"/" + _raw(entry)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if entry.type == "dir":
            os.makedirs(full, exist_ok=True)
        elif entry.type == "symlink":
            os.symlink(os.fsencode(entry.target or ""), full)
        else:
            assert entry.sha256 is not None
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out, store.open(entry.sha256) as blob:
                while chunk := blob.read(CHUNK):
                    out.write(chunk)
            os.chmod(full, entry.mode & 0o777)
            os.utime(full, (entry.mtime, entry.mtime))
    for entry in manifest.entries:
        if entry.type == "dir":
            os.chmod(base + b"/" + _raw(entry), (entry.mode & 0o777) | 0o700)


class Problem(BaseModel):
    path: str
    detail: str


def verify(store: BlobStore, digest: str, checked: dict[str, bool] | None = None) -> list[Problem]:
    """Re-hash the manifest and every file blob it names; [] means the snapshot is intact.

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
        manifest = load_manifest(store, digest)
    except ValueError as exc:
        return [Problem(path="(manifest)", detail=f"manifest does not parse: {exc}")]
    problems = []
    for entry in manifest.files:
        if entry.sha256 is None or not ok(entry.sha256):
            problems.append(
                Problem(path=entry.path, detail=f"blob {entry.sha256} missing or corrupt")
            )
        elif store.path(entry.sha256).stat().st_size != entry.size:
            problems.append(Problem(path=entry.path, detail="blob size differs from the manifest"))
    return problems


class Diff(BaseModel):
    added: list[str]
    removed: list[str]
    changed: list[str]

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


def diff(old: Manifest, new: Manifest) -> Diff:
    """File-level difference: content, type, mode or link target changed."""
    a, b = old.by_path(), new.by_path()

    def signature(e: Entry) -> tuple[object, ...]:
        return (e.type, e.sha256, e.mode, e.target)

    return Diff(
        added=sorted(set(b) - set(a)),
        removed=sorted(set(a) - set(b)),
        changed=sorted(p for p in set(a) & set(b) if signature(a[p]) != signature(b[p])),
    )
