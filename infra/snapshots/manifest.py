"""What a snapshot is: its manifest (entries, skip records, limits) and reading one back."""

from __future__ import annotations

import base64
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, Field

from infra.blobs import BlobStore

DEFAULT_MAX_FILE_BYTES = 10 * 1024 * 1024
# New content (not in the store yet) one capture may add to the portal's blob store: files past
# it are skipped (`over_budget`). Without it a participant on a profile with a 1 TB disk could
# write that much distinct data before each checkpoint, all of it copied to the portal's disk.
DEFAULT_MAX_NEW_BYTES = 4 * 1024**3
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
MANIFEST_VERSION = 2


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
    "over_budget",
]


class CaptureError(Exception):
    """The source could not be read as a whole (broken or truncated archive); nothing is kept."""


class ArchiveTruncated(CaptureError):
    """The archive ended inside a file: the sender gave up on it (it changed while sent).
    ``kept``: whether the file was being kept (its partial content is then kept, marked
    changed), or passed over unread (over the size limit, ignored)."""

    def __init__(
        self,
        key: bytes,
        display: str,
        partial: bytes,
        member: tarfile.TarInfo,
        *,
        kept: bool = True,
    ) -> None:
        super().__init__(f"the archive could not be read to its end: it ended inside {display}")
        self.key = key
        self.display = display
        self.partial = partial
        self.member = member
        self.kept = kept


def b64(raw: bytes) -> str:
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
    max_new_bytes: int = DEFAULT_MAX_NEW_BYTES
    ignore: tuple[str, ...] = DEFAULT_IGNORE
    # Which layout policy chose ``ignore``; exports state it (see `limits_for_policy`).
    policy: ExportPolicy = "baseline"


def limits_for_policy(
    policy: ExportPolicy,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    max_new_bytes: int = DEFAULT_MAX_NEW_BYTES,
) -> Limits:
    """Baseline drops caches and environments from snapshots; PaperBench's own tarball keeps
    ``.cache``, ``node_modules``, ``wandb``, ``__pycache__`` and ``venv`` (its reproduction
    removes ``venv``/``.venv`` before running, as ours does)."""
    ignore = DEFAULT_IGNORE if policy == "baseline" else ()
    return Limits(
        max_file_bytes=max_file_bytes, max_new_bytes=max_new_bytes, ignore=ignore, policy=policy
    )


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


class EntryPart(BaseModel):
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
        yield from EntryPart.model_validate_json(store.get_bytes(part)).entries
