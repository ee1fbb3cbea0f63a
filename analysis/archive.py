"""Study archives from the analyst's side: write one with the analysis' own tables in it, and
load a study from one alone (published-data mode: no database, no portal), as the same
`StudyData` the figures and the report are drawn from.

The archive carries the tidy table and the judge agreement exactly as `analysis.table` computed
them in the home that exported it, so a reader's figures are the exporter's.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
from sqlalchemy.orm import Session

from analysis.table import StudyData, load_from_session
from baseline.archive.export import ExportResult, export_study
from baseline.archive.manifest import ArchiveOptions
from baseline.archive.reader import ArchiveInvalid, open_archive
from baseline.models import Study
from infra.blobs import BlobStore

TIDY = "tidy"
AGREEMENT = "agreement"


def archive_study(
    session: Session,
    store: BlobStore,
    study: Study,
    out: Path,
    options: ArchiveOptions | None = None,
) -> ExportResult:
    """Write `study`'s archive to `out`, with its tidy table and judge agreement."""
    data = load_from_session(session, study)
    return export_study(
        session,
        store,
        study,
        out,
        options=options,
        results={TIDY: data.table, AGREEMENT: data.agreement},
    )


def load_archive(path: Path) -> StudyData:
    """The study in the archive at `path` (checked against its manifest first), priced as it
    was published."""
    with open_archive(path) as archive:
        for name in (TIDY, AGREEMENT):
            if not archive.has(f"results/{name}.parquet"):
                raise ArchiveInvalid(f"{path}: the archive has no results/{name}.parquet")
        table = pd.read_parquet(io.BytesIO(archive.read(f"results/{TIDY}.parquet")))
        agreement = pd.read_parquet(io.BytesIO(archive.read(f"results/{AGREEMENT}.parquet")))
        studies = pq.read_table(io.BytesIO(archive.read("tables/studies.parquet"))).to_pylist()
    if len(studies) != 1:
        raise ArchiveInvalid(f"{path}: tables/studies.parquet holds {len(studies)} studies, not 1")
    study = studies[0]
    return StudyData(
        study_id=int(study["id"]),
        name=str(study["name"]),
        checkpoints=[float(h) for h in json.loads(study["checkpoint_hours"])],
        human_hourly_rate_usd=float(study["human_hourly_rate_usd"]),
        table=table,
        synthetic=bool(table["synthetic"].any()) if len(table) else False,
        agreement=agreement,
    )
