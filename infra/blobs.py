"""Content-addressed blob store on the local file system.

Blobs are named by their sha256 and written atomically (temporary file, fsync, rename), so a blob
that exists is always complete and identical content is stored once. Task files, snapshot files,
manifests and logs all live here.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

CHUNK = 1 << 20


class BlobNotFound(KeyError):
    """No blob with that digest."""


def _valid_digest(digest: str) -> bool:
    return len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


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
            self._write(digest, iter([data]))
        return digest

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

    def _write(self, digest: str, chunks: Iterator[bytes]) -> None:
        self._tmp.mkdir(parents=True, exist_ok=True)
        target = self.path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp)
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp_name, 0o444)
            os.replace(tmp_name, target)
        except BaseException:
            if os.path.exists(tmp_name):
                os.unlink(tmp_name)
            raise

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
