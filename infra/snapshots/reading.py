"""Snapshots read back: exported as a tar, restored into a directory, verified, counted, diffed."""

from __future__ import annotations

import contextlib
import errno
import os
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Literal

from pydantic import BaseModel

from infra.blobs import CHUNK, BlobStore
from infra.snapshots.collector import DIR_FLAGS, clean_name
from infra.snapshots.manifest import EXPORT_ROOT, Entry, Manifest, Skipped, iter_entries

# Owner written into exports: the workspace user (uid 1000 in the workspace images), never root,
# so extracting an export as root (as PaperBench's reproduction does) creates nothing root owns.
EXPORT_UID = EXPORT_GID = 1000
# Bits an export or restore may carry: permissions only, never setuid/setgid/sticky.
PERMISSION_BITS = 0o777
# Directories of a restore's current path held open at once; the others are opened again.
FD_WINDOW = 32


def export_tar(
    store: BlobStore,
    manifest: Manifest,
    out: BinaryIO,
    gzip: bool = True,
    root: str = EXPORT_ROOT,
    owner: tuple[int, int] = (EXPORT_UID, EXPORT_GID),
) -> None:
    """Write the snapshot as a tar (gzip by default) with everything under ``root/``.

    This is PaperBench's submission layout: ``submission.tar.gz`` holding ``submission/...``.
    Names and link targets are the captured bytes; permissions only (no setuid/setgid/sticky);
    every member owned by `owner` (the unprivileged `EXPORT_UID` unless a workspace's user is
    given). A global header names the layout policy
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
            (info.uid, info.gid), info.uname, info.gname = owner, "", ""
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


@contextlib.contextmanager
def tar_file(
    store: BlobStore,
    manifest: Manifest,
    *,
    root: str = EXPORT_ROOT,
    owner: tuple[int, int] = (EXPORT_UID, EXPORT_GID),
) -> Iterator[BinaryIO]:
    """The snapshot as an uncompressed tar in a temporary file, open at its start and removed
    afterwards: what a workspace is seeded, restored or scored from. Written on disk and read
    back in blocks, so a snapshot of any size costs the process no more memory than one block
    (held whole, a 400 MB snapshot took a scheduler from 75 to 839 MB)."""
    with tempfile.TemporaryFile() as out:
        export_tar(store, manifest, out, gzip=False, root=root, owner=owner)
        out.seek(0)
        yield out


class _DirChain:
    """The directories along the current path below a restore's destination, each opened
    relative to its parent with ``O_NOFOLLOW``: no path string is resolved, however long, and a
    symlink is never walked through. Sorted entries reuse the common prefix. At most
    `FD_WINDOW` of them are held open (a tree 2,000 levels deep would exhaust the process's
    descriptors); a level closed is opened again from the nearest open one when needed."""

    def __init__(self, base_fd: int) -> None:
        self.base = base_fd
        self.parts: list[bytes] = []
        self.fds: list[int | None] = []

    def open(self, parts: list[bytes]) -> int:
        common = 0
        while common < min(len(parts), len(self.parts)) and parts[common] == self.parts[common]:
            common += 1
        for fd in self.fds[common:]:
            if fd is not None:
                os.close(fd)
        del self.fds[common:], self.parts[common:]
        for part in parts[common:]:
            parent = self._last()
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=parent)
            self.fds.append(os.open(part, DIR_FLAGS, dir_fd=parent))
            self.parts.append(part)
            self._close_above_window()
        return self._last()

    def _last(self) -> int:
        """The deepest level's descriptor, the levels above it opened again where closed."""
        if not self.fds:
            return self.base
        start = next((i for i in range(len(self.fds) - 1, -1, -1) if self.fds[i] is not None), -1)
        for index in range(start + 1, len(self.fds)):
            parent = self.fds[index - 1] if index else self.base
            assert parent is not None
            self.fds[index] = os.open(self.parts[index], DIR_FLAGS, dir_fd=parent)
            if index - 1 > start:  # a level opened on the way down: not kept
                os.close(parent)
                self.fds[index - 1] = None
        self._close_above_window()
        last = self.fds[-1]
        assert last is not None
        return last

    def _close_above_window(self) -> None:
        """Close the shallowest open levels, never the deepest, until `FD_WINDOW` are open."""
        open_levels = [i for i, fd in enumerate(self.fds[:-1]) if fd is not None]
        excess = len(open_levels) + 1 - FD_WINDOW
        for index in open_levels[: max(0, excess)]:
            fd = self.fds[index]
            assert fd is not None
            os.close(fd)
            self.fds[index] = None

    def close(self) -> None:
        for fd in self.fds:
            if fd is not None:
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
        if clean_name(entry.key) != entry.key:
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
            if entry.type == "dir" and clean_name(entry.key):
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
