"""Write a study's archive: one tar file with the manifest first, a README, the study's tables as
Parquet, the analysis tables the caller computed, and every blob the rows name (task files,
snapshot manifests and files, reproduction logs, tool outputs) under ``blobs/<sha256>``.

The output is written to a temporary file beside OUT and renamed at the end, so a failed export
leaves nothing behind. Each blob is hashed as it is copied: a store file whose content no longer
matches its name stops the export (it would otherwise travel under a hash it does not have).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import __version__
from baseline.archive import readme
from baseline.archive.manifest import (
    MANIFEST_NAME,
    README_NAME,
    ArchivedStudy,
    ArchiveFile,
    ArchiveManifest,
    ArchiveOptions,
)
from baseline.archive.redact import Redactor
from baseline.archive.tables import (
    RECORDING_BLOB_COLUMN,
    TABLES,
    TableSpec,
    expert_gradings,
    notes_of,
    schema,
    study_rows,
    to_record,
)
from baseline.errors import Conflict, DomainError
from baseline.models import Attempt, Host, Participant, Study, Workspace
from baseline.studies import studies
from infra.blobs import BlobStore
from infra.snapshots.manifest import Manifest, iter_entries

IMAGES_FILE = "tables/workspace_images.parquet"
GZIP_SUFFIXES = (".tar.gz", ".tgz")


class ArchiveExportError(DomainError):
    """The archive could not be written; the message says why."""


@dataclass(frozen=True)
class ExportResult:
    path: Path
    manifest: ArchiveManifest
    manifest_sha256: str
    size: int


def export_study(
    session: Session,
    store: BlobStore,
    study: Study,
    out: Path,
    *,
    options: ArchiveOptions | None = None,
    results: Mapping[str, pd.DataFrame] | None = None,
) -> ExportResult:
    """Archive `study` into `out` (a .tar, or gzip-compressed when it ends in .tar.gz/.tgz).

    `results` are the analysis tables (name -> frame), written as ``results/<name>.parquet`` with
    their column types, so that the archive alone reproduces the analysis.
    """
    live = studies.live_attempts(session, study.id)
    if live:
        raise Conflict(
            f"study {study.name!r} has attempts still under way ({', '.join(live)}): an archive "
            "is the record of attempts that ended or never started; end or wait for them first"
        )
    chosen = options or ArchiveOptions()
    members: dict[str, bytes] = {}
    recorded: dict[str, bytes] = {}  # terminal recordings: in the database, not the store
    redactor = _redactor(session, study.id)
    for spec in TABLES:
        if spec.recordings and not chosen.recordings:
            continue
        members[spec.file] = _table_bytes(session, spec, study.id, chosen, recorded, redactor)
    members[IMAGES_FILE] = _images(session, study.id)
    for name, frame in sorted((results or {}).items()):
        members[f"results/{name}.parquet"] = _frame_bytes(frame)
    blobs = _referenced_blobs(session, store, study.id)
    sizes = _sizes(store, blobs)
    present = sorted(set(sizes) - set(recorded))  # a recording's bytes are written once
    absent = sorted(blobs - set(sizes))
    members[README_NAME] = readme.text(
        study.name, chosen, sorted(members), len(present) + len(recorded)
    ).encode()
    members |= {f"blobs/{digest}": data for digest, data in recorded.items()}
    files = [ArchiveFile(path=p, size=len(b), sha256=_sha(b)) for p, b in sorted(members.items())]
    files += [ArchiveFile(path=f"blobs/{d}", size=sizes[d], sha256=d) for d in present]
    manifest = ArchiveManifest(
        archive_id=uuid.uuid4().hex,
        created_at=datetime.now(UTC),
        baseline_version=__version__,
        study=ArchivedStudy(id=study.id, name=study.name),
        options=chosen,
        files=files,
        absent_blobs=absent,
    )
    head = manifest.model_dump_json(indent=1).encode()
    out = Path(out)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        mode = "w:gz" if out.name.endswith(GZIP_SUFFIXES) else "w"
        with tarfile.open(tmp, mode) as tar:  # type: ignore[call-overload]
            _add(tar, MANIFEST_NAME, io.BytesIO(head), len(head))
            for path, data in sorted(members.items()):
                _add(tar, path, io.BytesIO(data), len(data))
            for digest in present:
                _add_blob(tar, store.path(digest), digest, sizes[digest])
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return ExportResult(out, manifest, _sha(head), out.stat().st_size)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _table_bytes(
    session: Session,
    spec: TableSpec,
    study_id: int,
    options: ArchiveOptions,
    recorded: dict[str, bytes],
    redactor: Redactor,
) -> bytes:
    experts = set(session.scalars(expert_gradings(study_id)))
    records = []
    for row in session.execute(study_rows(spec, study_id)).mappings():
        refs: dict[str, str] = {}
        if spec.recordings:
            refs[RECORDING_BLOB_COLUMN] = _sha(row["content"])  # travels as a blob like others
            recorded[refs[RECORDING_BLOB_COLUMN]] = row["content"]
        blank = frozenset() if options.notes else notes_of(spec, row, experts)
        record = to_record(spec, row, blank=blank, blob=refs)
        records.append(redactor.record(spec.name, record))
    return _parquet(pa.Table.from_pylist(records, schema=schema(spec)))


def _redactor(session: Session, study_id: int) -> Redactor:
    """The study's participants' display names (which alert messages quote) to pseudonyms, and
    the hosts' names (which they quote too) to their ids."""
    rows = session.execute(
        select(Participant.display_name, Participant.pseudonym).where(
            Participant.study_id == study_id
        )
    )
    hosts = session.execute(select(Host.name, Host.id))
    return Redactor(
        {name: pseudonym for name, pseudonym in rows}, {name: host_id for name, host_id in hosts}
    )


def _images(session: Session, study_id: int) -> bytes:
    """The image each workspace of the study ran (tag and digest) and its hardware profile."""
    rows = session.execute(
        select(
            Workspace.attempt_id,
            Workspace.purpose,
            Workspace.image,
            Workspace.image_digest,
            Workspace.hardware_profile,
        )
        .join(Attempt, Attempt.id == Workspace.attempt_id)
        .where(Attempt.study_id == study_id)
        .order_by(Workspace.id)
    )
    records = [
        {
            "attempt_id": r.attempt_id,
            "purpose": r.purpose.value,
            "image": r.image,
            "image_digest": r.image_digest,
            "hardware_profile": r.hardware_profile,
        }
        for r in rows
    ]
    fields = [("attempt_id", pa.int64())] + [
        (n, pa.string()) for n in ("purpose", "image", "image_digest", "hardware_profile")
    ]
    return _parquet(pa.Table.from_pylist(records, schema=pa.schema(fields)))


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _frame_bytes(frame: pd.DataFrame) -> bytes:
    sink = io.BytesIO()
    frame.to_parquet(sink, index=False)
    return sink.getvalue()


def _referenced_blobs(session: Session, store: BlobStore, study_id: int) -> set[str]:
    """Every blob the study's rows name, snapshot manifests expanded to their parts and files."""
    by_name = {spec.name: spec for spec in TABLES}
    found: set[str] = set()
    for row in session.execute(study_rows(by_name["task_files"], study_id)):
        found.add(row.sha256)
    manifests: set[str] = set()
    for row in session.execute(study_rows(by_name["snapshots"], study_id)):
        manifests.add(row.manifest_sha256)
    for row in session.execute(study_rows(by_name["reproductions"], study_id)):
        if row.log_sha256:
            found.add(row.log_sha256)
        if row.executed_manifest_sha256:
            manifests.add(row.executed_manifest_sha256)
    for row in session.execute(study_rows(by_name["transcript_entries"], study_id)):
        if row.output_sha256:
            found.add(row.output_sha256)
    for digest in manifests:
        found |= set(_manifest_blobs(store, digest))
    return found


def _manifest_blobs(store: BlobStore, digest: str) -> Iterator[str]:
    yield digest
    if not store.exists(digest):
        return
    head = Manifest.model_validate_json(store.get_bytes(digest))
    yield from head.parts
    yield from head.skipped_parts
    for entry in iter_entries(store, head):
        if entry.sha256:
            yield entry.sha256


def _add(tar: tarfile.TarFile, name: str, data: BinaryIO, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    tar.addfile(info, data)


class _Hashing(io.RawIOBase):
    """A blob file read through a sha256, so the copy is checked as it is written."""

    def __init__(self, handle: BinaryIO) -> None:
        self.handle = handle
        self.hasher = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.hasher.update(data)
        return data


def _sizes(store: BlobStore, digests: set[str]) -> dict[str, int]:
    """The size of each blob the store holds (one stat each); absent ones are left out."""
    sizes = {}
    for digest in digests:
        try:
            sizes[digest] = store.path(digest).stat().st_size
        except FileNotFoundError:
            continue
    return sizes


def _add_blob(tar: tarfile.TarFile, path: Path, digest: str, size: int) -> None:
    with open(path, "rb") as handle:
        reader = _Hashing(handle)
        _add(tar, f"blobs/{digest}", reader, size)  # type: ignore[arg-type]
    if reader.hasher.hexdigest() != digest:
        raise ArchiveExportError(
            f"blob {digest} in the store does not match its name (corrupted); not archived"
        )


def describe(result: ExportResult) -> dict[str, Any]:
    """What the export command prints."""
    return {
        "path": str(result.path),
        "files": len(result.manifest.files),
        "bytes": result.size,
        "manifest_sha256": result.manifest_sha256,
        "archive_id": result.manifest.archive_id,
    }
