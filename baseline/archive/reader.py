"""Open an archive and check it against its manifest: on opening, every member must be listed,
every listed file present, a plain file of the listed size, and a blob named by its listed
sha256; the tables, results and README are hashed then too, and each blob when it is read
(once); `verify` checks every blob before a caller that needs them all (an import) writes
anything. The first problem is refused with the file's name (`ArchiveInvalid`).

Blobs are hashed on reading because they are nearly all of an archive's bytes and a reader of
the study's tables needs none of them (`analysis.archive.load_archive`, behind `plot --archive`):
hashing every blob on every open cost it the whole archive's hashing. The tables, a small part,
are what any reader reads, so a changed one is refused on opening. No byte reaches a caller
unchecked either way."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path, PurePosixPath
from types import TracebackType

from pydantic import ValidationError

from baseline.archive.manifest import MANIFEST_NAME, SCHEMA_VERSION, ArchiveManifest
from baseline.errors import InvalidInput

CHUNK = 1 << 20
BLOBS = "blobs/"  # content named by its sha256: hashed when read, or by `Archive.verify`


class ArchiveInvalid(InvalidInput):
    """The file is not an intact study archive; the message names the file at fault."""


class Archive:
    """An archive whose member list and tables are checked; each blob is checked when read. Use
    as a context manager (the tar file stays open while read)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._tar = tarfile.open(self.path, "r:*")  # noqa: SIM115 (closed by __exit__)
        except tarfile.ReadError as exc:  # its message lists every compression tried
            raise ArchiveInvalid(
                f"{self.path}: not a study archive (not a tar file, compressed or not)"
            ) from exc
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
        """A listed member's bytes, refused if its sha256 is not the manifest's."""
        data = self._bytes(path)
        if path not in self._verified:
            expected = self._listed[path]
            digest = hashlib.sha256(data).hexdigest()
            if digest != expected.sha256:
                raise self._changed(path, digest, len(data))
            self._verified.add(path)
        return data

    def has(self, path: str) -> bool:
        return path in self._members

    def verify(self) -> None:
        """Check every blob not read yet against the manifest (streamed, never held whole)."""
        for path, member in self._members.items():
            if path not in self._verified:
                self._check_one(path, member)

    def _check_one(self, path: str, member: tarfile.TarInfo) -> None:
        digest, size = self._hash(member)
        expected = self._listed[path]
        if digest != expected.sha256 or size != expected.size:
            raise self._changed(path, digest, size)
        self._verified.add(path)

    def _bytes(self, path: str) -> bytes:
        if path not in self._members:
            raise ArchiveInvalid(f"{self.path}: the archive has no {path}")
        handle = self._tar.extractfile(self._members[path])
        if handle is None:
            raise ArchiveInvalid(f"{self.path}: {path} is not a file")
        with handle:
            return handle.read()

    def _changed(self, path: str, digest: str, size: int) -> ArchiveInvalid:
        expected = self._listed[path]
        return ArchiveInvalid(
            f"{self.path}: {path} was changed: its sha256 is {digest} ({size} bytes), "
            f"{MANIFEST_NAME} says {expected.sha256} ({expected.size} bytes)"
        )

    def _check(self) -> ArchiveManifest:
        """The manifest, once the member list and the tables agree with it (no blob read)."""
        members = self._tar.getmembers()
        if not members or members[0].name != MANIFEST_NAME:
            raise ArchiveInvalid(f"{self.path}: not a study archive (no {MANIFEST_NAME} first)")
        self._members = {MANIFEST_NAME: members[0]}
        self._verified = {MANIFEST_NAME}  # the manifest is not listed in itself
        try:
            manifest = ArchiveManifest.model_validate_json(self._bytes(MANIFEST_NAME))
        except ValidationError as exc:
            raise ArchiveInvalid(f"{self.path}: {MANIFEST_NAME} is not valid: {exc}") from exc
        if manifest.schema_version > SCHEMA_VERSION:
            raise ArchiveInvalid(
                f"{self.path}: archive schema version {manifest.schema_version} is newer than "
                f"this Baseline reads ({SCHEMA_VERSION})"
            )
        listed = self._listed = manifest.by_path()
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
            if member.size != expected.size:
                raise ArchiveInvalid(
                    f"{self.path}: {name} was changed: it is {member.size} bytes, "
                    f"{MANIFEST_NAME} says {expected.size}"
                )
            if not name.startswith(BLOBS):
                self._check_one(name, member)
            elif name != f"{BLOBS}{expected.sha256}":
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
    """The archive at `path`, its member list and tables checked (each blob is when read, all of
    them by `Archive.verify`); `ArchiveInvalid` names the first file at fault."""
    if not Path(path).is_file():
        raise ArchiveInvalid(f"{path}: no such archive file")
    return Archive(Path(path))
