"""Snapshots of an attempt: list, manifest, download (submission.tar.gz) and file-level diff.

Who reads a snapshot: staff any; a participant those of their own attempts; a grader only the
snapshots of paper tasks, which are in the blind grading queue (never the list of an attempt,
whose timing and count would tell who made it).
"""

from __future__ import annotations

import io
from typing import Any

from apiflask import Schema
from apiflask.fields import Boolean, DateTime, Dict, Float, Integer, List, Nested, String
from apiflask.schemas import FileSchema
from apiflask.validators import Range
from flask import g

from app.access import STAFF, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, blobs_present, bp, context, send_bytes, user
from baseline.attempts import snapshots
from baseline.errors import NotFound
from baseline.grading import expert_grading
from baseline.models import Role, Snapshot
from baseline.people import visibility

READERS = (Role.PARTICIPANT, Role.GRADER, *STAFF)
READ_ERRORS = [*AUTH_ERRORS, 404, 409, 422]


class SnapshotOut(Schema):
    id = Integer(required=True)
    attempt_id = Integer(required=True)
    kind = String(required=True)
    due_working_s = Float(required=True)
    taken_working_s = Float(required=True)
    taken_at = DateTime(required=True)
    late = Boolean(required=True)
    file_count = Integer(required=True)
    total_bytes = Integer(required=True)
    skipped_count = Integer(required=True)
    source = String(required=True)


class SnapshotListOut(Schema):
    snapshots = List(Nested(SnapshotOut), required=True)


class ManifestOut(Schema):
    snapshot_id = Integer(required=True)
    source = String(required=True)
    files = List(Dict(), required=True)
    skipped = List(Dict(), required=True)


class DiffQuery(Schema):
    against = Integer(load_default=None, validate=Range(min=1, max=2**63 - 1))


class DiffOut(Schema):
    old_id = Integer(allow_none=True)
    new_id = Integer(required=True)
    added = List(String(), required=True)
    removed = List(String(), required=True)
    changed = List(String(), required=True)


def readable_snapshot(snapshot_id: int) -> Snapshot:
    """The snapshot if the caller may read it; otherwise reported missing (no id probing)."""
    caller = user()
    if caller.role is Role.GRADER:
        return expert_grading.snapshot(g.db, snapshot_id)
    row = g.db.get(Snapshot, snapshot_id)
    if row is None:
        raise NotFound(f"no snapshot with id {snapshot_id}")
    visibility.visible_attempt(g.db, caller, row.attempt_id)
    return row


@bp.get("/attempts/<int:attempt_id>/snapshots")
@requires(Role.PARTICIPANT, *STAFF)
@bp.output(SnapshotListOut)
@bp.doc(summary="Snapshots of an attempt", responses=[*AUTH_ERRORS, 404], security=BEARER)
def list_snapshots(attempt_id: int) -> Any:
    attempt = visibility.visible_attempt(g.db, user(), attempt_id)
    return {"snapshots": snapshots.list_snapshots(g.db, attempt.id)}


@bp.get("/snapshots/<int:snapshot_id>/manifest")
@requires(*READERS)
@bp.output(ManifestOut)
@bp.doc(summary="Files of a snapshot (path, size, sha256)", responses=READ_ERRORS, security=BEARER)
def manifest(snapshot_id: int) -> Any:
    row = readable_snapshot(snapshot_id)
    manifest = snapshots.manifest_of(snapshots.store_for(context()), row)
    return {
        "snapshot_id": row.id,
        "source": manifest.source,
        "files": [e.model_dump(mode="json") for e in manifest.files],
        "skipped": [s.model_dump(mode="json") for s in manifest.skipped],
    }


@bp.get("/snapshots/<int:snapshot_id>/download")
@requires(*READERS)
@bp.output(FileSchema(), content_type="application/gzip")
@bp.doc(
    summary="The snapshot as submission.tar.gz (PaperBench layout)",
    responses=READ_ERRORS,
    security=BEARER,
)
def download(snapshot_id: int) -> Any:
    row = readable_snapshot(snapshot_id)
    buffer = io.BytesIO()
    with blobs_present(f"snapshot {row.id}"):
        snapshots.export_snapshot(g.db, snapshots.store_for(context()), row.id, buffer)
    return send_bytes(buffer.getvalue(), "application/gzip", f"snapshot-{row.id}-submission.tar.gz")


@bp.get("/snapshots/<int:snapshot_id>/diff")
@requires(*READERS)
@bp.input(DiffQuery, location="query", arg_name="query")
@bp.output(DiffOut)
@bp.doc(
    summary="Files added, removed and changed since another snapshot of the same attempt "
    "(default: the previous one)",
    responses=READ_ERRORS,
    security=BEARER,
)
def diff(snapshot_id: int, query: dict[str, Any]) -> Any:
    row = readable_snapshot(snapshot_id)
    if query["against"] is None:
        old = expert_grading.previous_snapshot(g.db, row)
        if old is None:
            manifest = snapshots.manifest_of(snapshots.store_for(context()), row)
            files = [e.path for e in manifest.files]
            return {"old_id": None, "new_id": row.id, "added": files, "removed": [], "changed": []}
    else:
        old = readable_snapshot(query["against"])
    change = snapshots.diff_snapshots(g.db, snapshots.store_for(context()), old.id, row.id)
    return {"old_id": old.id, "new_id": row.id, **change.model_dump()}
