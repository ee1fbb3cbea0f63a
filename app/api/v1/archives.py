"""A study's archive for download: the same file `baseline study archive` writes (manifest with
every file's sha256, Parquet tables, the analysis' tables, blobs, README; participants by
pseudonym only). Staff only: it holds agent transcripts, which name models and unblind."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from apiflask import Schema
from apiflask.fields import Boolean
from apiflask.schemas import FileSchema
from flask import g, send_file

from app.access import STAFF, requires
from app.api.v1.common import AUTH_ERRORS, BEARER, bp, context, user
from baseline import audit
from baseline.archive.manifest import ArchiveOptions
from baseline.attempts import snapshots
from baseline.people import visibility


class ArchiveQuery(Schema):
    include_notes = Boolean(
        load_default=False, metadata={"description": "keep free-text notes (pauses, experts)"}
    )
    include_recordings = Boolean(
        load_default=False,
        metadata={"description": "keep humans' terminal recordings and shell histories"},
    )


@bp.get("/studies/<int:study_id>/archive")
@requires(*STAFF)
@bp.input(ArchiveQuery, location="query", arg_name="query")
@bp.output(FileSchema(), content_type="application/x-tar")
@bp.doc(
    summary="The study as one archive (.tar): manifest with sha256 per file, tables, results, "
    "blobs; participants pseudonymised; `baseline study import-archive` reads it",
    responses=[*AUTH_ERRORS, 404, 409, 422],
    security=BEARER,
)
def study_archive(study_id: int, query: dict[str, Any]) -> Any:
    from analysis.archive import archive_study  # pandas loads only when an archive is asked for

    study = visibility.visible_study(g.db, user(), study_id)
    options = ArchiveOptions(notes=query["include_notes"], recordings=query["include_recordings"])
    with tempfile.TemporaryDirectory(prefix="bl-archive-") as folder:
        path = Path(folder) / "study.tar"
        result = archive_study(g.db, snapshots.store_for(context()), study, path, options)
        handle = path.open("rb")  # stays readable after the folder is removed; sent, then closed
    audit.record(
        g.db,
        "study.archived",
        "study",
        study.id,
        user().id,
        archive_id=result.manifest.archive_id,
        notes=options.notes,
        recordings=options.recordings,
    )
    g.db.commit()
    return send_file(
        handle,
        mimetype="application/x-tar",
        as_attachment=True,
        download_name=f"study-{study.id}-archive.tar",
    )
