"""The blob store's two-step write (`stage`, then `commit`): a blob exists only once it is
complete and synced, and a write that fails leaves neither a blob nor a temporary file."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from infra.blobs import BlobStore


def _temporaries(store: BlobStore) -> list[str]:
    tmp = store.root / "tmp"
    return sorted(os.listdir(tmp)) if tmp.exists() else []


def test_put_bytes_stores_read_only_content_once(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    digest = store.put_bytes(b"alpha")
    assert digest == hashlib.sha256(b"alpha").hexdigest()
    assert store.get_bytes(digest) == b"alpha"
    assert store.path(digest).stat().st_mode & 0o777 == 0o444
    assert store.put_bytes(b"alpha") == digest
    assert _temporaries(store) == []


def test_a_staged_blob_exists_only_once_committed(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = os.urandom(200_000)  # more than one write() may take
    digest = hashlib.sha256(data).hexdigest()
    staged = store.stage(digest, data)
    assert not store.exists(digest)
    assert len(_temporaries(store)) == 1
    store.commit(staged)
    assert store.get_bytes(digest) == data and store.verify(digest)
    assert _temporaries(store) == []
    with pytest.raises(OSError):
        os.fstat(staged.fd)  # committed: its descriptor is closed


def test_a_failed_sync_leaves_no_blob_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BlobStore(tmp_path)
    digest = hashlib.sha256(b"beta").hexdigest()
    staged = store.stage(digest, b"beta")

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="Input/output"):
        store.commit(staged)
    assert not store.exists(digest)
    assert _temporaries(store) == []
    with pytest.raises(OSError):
        os.fstat(staged.fd)


def test_staging_under_a_name_that_is_not_a_digest_writes_nothing(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    with pytest.raises(ValueError, match="not a sha256 digest"):
        store.stage("../../escape", b"x")
    assert _temporaries(store) == []
    assert not (tmp_path.parent / "escape").exists()
