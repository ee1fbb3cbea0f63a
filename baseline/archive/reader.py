"""Open an archive and check it against its manifest before anything is read from it: every
member must be listed, every listed file present, and every file's sha256 and size as the
manifest says. The first problem is refused with the file's name (`ArchiveInvalid`)."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path, PurePosixPath
from types import TracebackType

from pydantic import ValidationError

from baseline.archive.manifest import MANIFEST_NAME, SCHEMA_VERSION, ArchiveManifest
from baseline.errors import InvalidInput

CHUNK = 1 << 20


class ArchiveInvalid(InvalidInput):
    """The file is not an intact study archive; the message names the file at fault."""


class Archive:
    """A checked archive; use as a context manager (the tar file stays open while read)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._tar = tarfile.open(self.path, "r:*")  # noqa: SIM115 (closed by __exit__)
        except (tarfile.TarError, OSError) as exc:
            raise ArchiveInvalid(f"{self.path}: not a study archive ({exc})") from exc
        try:
            self.manifest = self._check()
        except BaseException:
            self._tar.close()
            raise

    def __enter__(self) -> Archive:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._tar.close()

    def read(self, path: str) -> bytes:
        """A listed member's bytes (already checked against the manifest)."""
        if path not in self._members:
            raise ArchiveInvalid(f"{self.path}: the archive has no {path}")
        handle = self._tar.extractfile(self._members[path])
        if handle is None:
            raise ArchiveInvalid(f"{self.path}: {path} is not a file")
        with handle:
            return handle.read()

    def has(self, path: str) -> bool:
        return path in self._members

    def _check(self) -> ArchiveManifest:
        members = self._tar.getmembers()
        if not members or members[0].name != MANIFEST_NAME:
            raise ArchiveInvalid(f"{self.path}: not a study archive (no {MANIFEST_NAME} first)")
        self._members = {MANIFEST_NAME: members[0]}
        try:
            manifest = ArchiveManifest.model_validate_json(self.read(MANIFEST_NAME))
        except ValidationError as exc:
            raise ArchiveInvalid(f"{self.path}: {MANIFEST_NAME} is not valid: {exc}") from exc
        if manifest.schema_version > SCHEMA_VERSION:
            raise ArchiveInvalid(
                f"{self.path}: archive schema version {manifest.schema_version} is newer than "
                f"this Baseline reads ({SCHEMA_VERSION})"
            )
        listed = manifest.by_path()
        for member in members[1:]:
            name = member.name
            if name in self._members:
                raise ArchiveInvalid(f"{self.path}: {name} is in the archive twice")
            if name not in listed:
                raise ArchiveInvalid(f"{self.path}: {name} is not listed in {MANIFEST_NAME}")
            if not member.isfile() or _unsafe(name):
                raise ArchiveInvalid(f"{self.path}: {name} is not a plain file inside the archive")
            self._members[name] = member
            expected = listed[name]
            digest, size = self._hash(member)
            if digest != expected.sha256 or size != expected.size:
                raise ArchiveInvalid(
                    f"{self.path}: {name} was changed: its sha256 is {digest} ({size} bytes), "
                    f"{MANIFEST_NAME} says {expected.sha256} ({expected.size} bytes)"
                )
            if name.startswith("blobs/") and name != f"blobs/{digest}":
                raise ArchiveInvalid(f"{self.path}: {name} is not named by its sha256")
        missing = sorted(set(listed) - set(self._members))
        if missing:
            raise ArchiveInvalid(
                f"{self.path}: {missing[0]} is listed in {MANIFEST_NAME} but not in the archive"
            )
        return manifest

    def _hash(self, member: tarfile.TarInfo) -> tuple[str, int]:
        hasher = hashlib.sha256()
        size = 0
        handle = self._tar.extractfile(member)
        if handle is None:
            raise ArchiveInvalid(f"{self.path}: {member.name} is not a file")
        with handle:
            while chunk := handle.read(CHUNK):
                hasher.update(chunk)
                size += len(chunk)
        return hasher.hexdigest(), size


def _unsafe(name: str) -> bool:
    path = PurePosixPath(name)
    return path.is_absolute() or ".." in path.parts


def open_archive(path: Path) -> Archive:
    """The archive at `path`, checked; `ArchiveInvalid` names the first file at fault."""
    if not Path(path).is_file():
        raise ArchiveInvalid(f"{path}: no such archive file")
    return Archive(Path(path))
