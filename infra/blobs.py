"""Content-addressed blob store on the local file system.

Blobs are named by their sha256 and written atomically (temporary file, fsync, rename), so a blob
that exists is always complete and identical content is stored once. Task files, snapshot files,
manifests and logs all live here.

Writing a blob is two steps, `stage` (write a temporary file) and `commit` (sync it, then name
it), so that a writer of many small blobs can stage them on its own thread and leave only the
syncs, which wait on the disk, to other threads (`infra.snapshots._BlobWrites`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20


class BlobNotFound(KeyError):
    """No blob with that digest."""


def _valid_digest(digest: str) -> bool:
    return len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


@dataclass(frozen=True)
class StagedBlob:
    """A blob's content in a temporary file of the store, still open (`BlobStore.stage`)."""

    digest: str
    tmp: str
    fd: int


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._tmp = self.root / "tmp"

    def path(self, digest: str) -> Path:
        if not _valid_digest(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return self.root / digest[:2] / digest[2:4] / digest

    def exists(self, digest: str) -> bool:
        return self.path(digest).exists()

    def put_bytes(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if not self.exists(digest):
            self.commit(self.stage(digest, data))
        return digest

    def stage(self, digest: str, data: bytes) -> StagedBlob:
        """Write `data`, whose sha256 is `digest`, to a new temporary file in the store (read-
        only, not yet synced): `commit` makes it the blob."""
        self.path(digest)  # validates the digest before anything is written
        self._tmp.mkdir(parents=True, exist_ok=True)
        tmp = f"{self._tmp}/{digest}.{os.urandom(8).hex()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        return StagedBlob(digest, tmp, fd)

    def commit(self, staged: StagedBlob) -> None:
        """Sync a staged file and name it as its blob (a blob that exists is complete)."""
        try:
            try:
                os.fsync(staged.fd)
            finally:
                os.close(staged.fd)
            folder = f"{self.root}/{staged.digest[:2]}/{staged.digest[2:4]}"
            os.makedirs(folder, exist_ok=True)
            os.replace(staged.tmp, f"{folder}/{staged.digest}")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged.tmp)
            raise

    def put_stream(self, stream: BinaryIO) -> tuple[str, int]:
        """Store a stream of unknown digest; returns (digest, size)."""
        self._tmp.mkdir(parents=True, exist_ok=True)
        hasher = hashlib.sha256()
        size = 0
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp)
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := stream.read(CHUNK):
                    hasher.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            digest = hasher.hexdigest()
            target = self.path(digest)
            if target.exists():
                os.unlink(tmp_name)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(tmp_name, 0o444)
                os.replace(tmp_name, target)
            return digest, size
        except BaseException:
            if os.path.exists(tmp_name):
                os.unlink(tmp_name)
            raise

    def put_file(self, path: Path) -> tuple[str, int]:
        with open(path, "rb") as handle:
            return self.put_stream(handle)

    def get_bytes(self, digest: str) -> bytes:
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError as exc:
            raise BlobNotFound(digest) from exc

    def open(self, digest: str) -> BinaryIO:
        try:
            return open(self.path(digest), "rb")
        except FileNotFoundError as exc:
            raise BlobNotFound(digest) from exc

    def verify(self, digest: str) -> bool:
        """Re-hash a blob; False when it is missing or its content no longer matches its name."""
        hasher = hashlib.sha256()
        try:
            with self.open(digest) as handle:
                while chunk := handle.read(CHUNK):
                    hasher.update(chunk)
        except BlobNotFound:
            return False
        return hasher.hexdigest() == digest
