"""Import a checked archive into this home as a new study, rows and blobs, so that its analysis
gives the same numbers as in the home it came from.

Rows get this home's ids (in the archive's order, so the order of rows, which the analysis keeps,
is the same) and every foreign key is translated. A task this home already has (same slug) is
reused when its content hash is the archive's and refused otherwise. Importing the same archive
twice is refused, as is a study whose name is taken: nothing is written then. People's accounts
do not travel, so an imported participant is named by its pseudonym.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.archive.reader import Archive, ArchiveInvalid
from baseline.archive.tables import (
    RECORDING_BLOB_COLUMN,
    TABLES,
    TableSpec,
    foreign_table,
    from_record,
)
from baseline.errors import Conflict
from baseline.models import LIVE_ATTEMPT_STATUSES, AuditEvent, Study, StudyStatus, Task
from infra.blobs import BlobStore

IMPORTED_ACTION = "study.imported_archive"
_LEADING_ATTEMPT = re.compile(r"^attempt (\d+)(?!\d)")


@dataclass
class ImportResult:
    study_id: int
    study_name: str
    blobs: int = 0
    rows: int = 0
    # archive id -> this home's id, per table: what a caller compares the two homes' tables by
    ids: dict[str, dict[int, int]] = field(default_factory=dict)


def import_archive(
    session: Session, store: BlobStore, archive: Archive, actor_id: int | None = None
) -> ImportResult:
    """Add the archive's study to this home (in the caller's transaction)."""
    manifest = archive.manifest
    _refuse_repeat(session, manifest.archive_id, manifest.study.name)
    archive.verify()  # every blob, before anything is written: a bad one leaves no trace
    ids: dict[str, dict[int, int]] = {}
    reused_tasks: set[int] = set()
    rows = 0
    for spec in TABLES:
        if not archive.has(spec.file):
            if spec.recordings or manifest.schema_version < spec.since:
                continue  # left out by choice, or written before the table was archived
            raise ArchiveInvalid(f"{archive.path}: the archive lacks {spec.file}")
        records = pq.read_table(io.BytesIO(archive.read(spec.file))).to_pylist()
        made: list[tuple[int, Any]] = []
        ids[spec.name] = {}
        for record in records:
            values = from_record(spec, record, _recording_blobs(archive, spec, record))
            old = int(values.pop("id") if spec.key == "id" else values[spec.key])
            _translate(archive, spec, values, old, ids)
            if spec.name == "alerts":
                values["subject"] = _subject(archive, spec, values["subject"], old, ids)
                values["message"] = _message(archive, spec, values["message"], old, ids)
            if spec.name == "tasks":
                existing = _existing_task(session, values)
                if existing is not None:
                    ids["tasks"][old] = existing
                    reused_tasks.add(existing)
                    continue
            if spec.name == "task_files" and values["task_id"] in reused_tasks:
                continue
            if spec.name == "participants":
                values["display_name"] = values["pseudonym"]
            if spec.name == "studies":
                values["status"] = StudyStatus.ARCHIVED  # nothing may run in it here
            if spec.name == "attempts" and values["status"] in LIVE_ATTEMPT_STATUSES:
                raise ArchiveInvalid(
                    f"{archive.path}: {spec.file} row {old} is an attempt still "
                    f"{values['status'].value}: an archive holds attempts that ended or never "
                    "started only"
                )
            made.append((old, spec.model(**values)))
        session.add_all([row for _, row in made])
        session.flush()
        ids[spec.name] |= {old: getattr(row, spec.key) for old, row in made}
        rows += len(made)
    # After the rows, so a refused import leaves the store as it was; in the caller's
    # transaction still, so rows are committed only once every blob they name is stored.
    blobs = 0
    for entry in manifest.files:
        if entry.path.startswith("blobs/"):
            store.put_bytes(archive.read(entry.path))
            blobs += 1
    study_id = ids["studies"][manifest.study.id]
    audit.record(
        session,
        IMPORTED_ACTION,
        "study",
        study_id,
        actor_id,
        archive_id=manifest.archive_id,
        from_study_id=manifest.study.id,
    )
    return ImportResult(study_id, manifest.study.name, blobs, rows, ids)


def _refuse_repeat(session: Session, archive_id: str, name: str) -> None:
    for event in session.scalars(select(AuditEvent).where(AuditEvent.action == IMPORTED_ACTION)):
        if event.details.get("archive_id") == archive_id:
            raise Conflict(
                f"archive {archive_id} was imported already (study {event.target_id}); "
                "nothing was changed"
            )
    if session.scalar(select(Study.id).where(Study.name == name)) is not None:
        raise Conflict(f"a study named {name!r} exists in this home; nothing was changed")


def _recording_blobs(archive: Archive, spec: TableSpec, record: dict[str, Any]) -> dict[str, bytes]:
    if not spec.recordings or record.get(RECORDING_BLOB_COLUMN) is None:
        return {}
    digest = str(record[RECORDING_BLOB_COLUMN])
    return {digest: archive.read(f"blobs/{digest}")}


def _translate(
    archive: Archive,
    spec: TableSpec,
    values: dict[str, Any],
    old: int,
    ids: dict[str, dict[int, int]],
) -> None:
    """Foreign keys from the archive's ids to this home's."""
    for column in spec.columns():
        target = foreign_table(column)
        value = values.get(column.key)
        if target is None or value is None:
            continue
        mapped = ids.get(target, {}).get(int(value))
        if mapped is None:
            raise ArchiveInvalid(
                f"{archive.path}: {spec.file} row {old} names {target} {value}, "
                "which the archive does not hold"
            )
        values[column.key] = mapped


def _subject(
    archive: Archive, spec: TableSpec, subject: str, old: int, ids: dict[str, dict[int, int]]
) -> str:
    """An alert's subject names an attempt by id ("attempt:12"): this home's id, as the board
    this home shows matches open alerts to its attempts by it. Other subjects are kept."""
    kind, _, value = subject.partition(":")
    if kind != "attempt" or not value.isdigit():
        return subject
    return f"attempt:{_attempt(archive, spec, int(value), old, ids, 'is about')}"


def _message(
    archive: Archive, spec: TableSpec, message: str, old: int, ids: dict[str, dict[int, int]]
) -> str:
    """An alert's message about an attempt opens with it ("attempt 12 (P-…, task): …",
    `baseline.monitor.rules`): this home's id too, so the text names the attempt its subject
    does. The rest of the text names no other row by id."""
    return _LEADING_ATTEMPT.sub(
        lambda m: f"attempt {_attempt(archive, spec, int(m[1]), old, ids, 'has a message naming')}",
        message,
    )


def _attempt(
    archive: Archive,
    spec: TableSpec,
    value: int,
    old: int,
    ids: dict[str, dict[int, int]],
    verb: str,
) -> int:
    mapped = ids.get("attempts", {}).get(value)
    if mapped is None:
        raise ArchiveInvalid(
            f"{archive.path}: {spec.file} row {old} {verb} attempt {value}, "
            "which the archive does not hold"
        )
    return mapped


def _existing_task(session: Session, values: dict[str, Any]) -> int | None:
    task = session.scalar(select(Task).where(Task.slug == values["slug"]))
    if task is None:
        return None
    if task.content_hash != values["content_hash"]:
        raise Conflict(
            f"task {task.slug!r} exists in this home with other content (content hash "
            f"{task.content_hash[:12]}, the archive's {values['content_hash'][:12]}); "
            "nothing was changed"
        )
    return task.id
