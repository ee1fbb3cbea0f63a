"""A study archived, imported into a fresh home and analysed there gives the same numbers; the
archive names no person; a changed file is refused by name; the same archive twice is refused."""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from sqlalchemy import func, select

from analysis import report
from analysis.archive import archive_study
from analysis.table import load_from_session
from baseline import migrate
from baseline.archive.export import ExportResult
from baseline.archive.importer import ImportResult, import_archive
from baseline.archive.manifest import ArchiveOptions
from baseline.archive.reader import ArchiveInvalid, open_archive
from baseline.attempts.snapshots import store_for
from baseline.config import Settings
from baseline.context import Context
from baseline.errors import Conflict
from baseline.jobs import orchestration
from baseline.models import (
    Attempt,
    AttemptStatus,
    Grading,
    JobStatus,
    Reproduction,
    Snapshot,
    Study,
    StudyStatus,
    StudyTask,
    Task,
    TerminalRecording,
)
from tests.analysis import archive_world
from tests.analysis.archive_world import NOTE, RECORDING, World


@dataclass
class Homes:
    source: Context
    world: World
    fresh: Callable[[], Context]


@pytest.fixture
def homes(ctx: Context, tmp_path: Path, migrated_sqlite: Path) -> Homes:
    with ctx.session() as session:
        world = archive_world.build(session, store_for(ctx), tmp_path / "work")
    made: list[Context] = []

    def fresh() -> Context:
        home = tmp_path / f"home{len(made) + 2}"
        home.mkdir()
        shutil.copyfile(migrated_sqlite, home / "db.sqlite")
        url = f"sqlite:///{home / 'db.sqlite'}"
        migrate.upgrade(url)
        made.append(Context.from_settings(Settings(home=home, database_url=url, secret_key="t")))
        return made[-1]

    return Homes(ctx, world, fresh)


def _archive(ctx: Context, study_id: int, out: Path, **options: bool) -> ExportResult:
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        return archive_study(session, store_for(ctx), study, out, ArchiveOptions(**options))


def _import(ctx: Context, path: Path) -> ImportResult:
    with open_archive(path) as archive, ctx.session() as session:
        return import_archive(session, store_for(ctx), archive)


def test_round_trip_reproduces_every_number(homes: Homes, tmp_path: Path) -> None:
    path = tmp_path / "study.tar"
    exported = _archive(homes.source, homes.world.study_id, path)
    with homes.source.session() as session:
        study = session.get(Study, homes.world.study_id)
        assert study is not None
        before = load_from_session(session, study)
    assert homes.world.floors == int(before.table["floor"].notna().sum()) > 0
    assert before.table["missing"].notna().any() and before.agreement.shape[0] > 0

    target = homes.fresh()
    imported = _import(target, path)
    assert imported.blobs == sum(1 for f in exported.manifest.files if f.path.startswith("blobs/"))
    with target.session() as session:
        study = session.get(Study, imported.study_id)
        assert study is not None
        after = load_from_session(session, study)
        # every blob the imported rows name is in the new home's store
        for snap in session.scalars(select(Snapshot)):
            present = store_for(target).exists(snap.manifest_sha256)
            assert present == (snap.manifest_sha256 not in exported.manifest.absent_blobs)

    pd.testing.assert_frame_equal(
        after.table, archive_world.mapped_ids(before.table, imported.ids), check_exact=True
    )
    pd.testing.assert_frame_equal(
        after.agreement, archive_world.mapped_ids(before.agreement, imported.ids), check_exact=True
    )
    assert (after.name, after.checkpoints, after.human_hourly_rate_usd) == (
        before.name,
        before.checkpoints,
        before.human_hourly_rate_usd,
    )
    ours, theirs = report.analyse(before), report.analyse(after)
    for name in report.SUMMARIES:
        pd.testing.assert_frame_equal(
            report.summary(theirs, name), report.summary(ours, name), check_exact=True
        )


@pytest.mark.sqlite_only(
    "what is checked is the archive's bytes, written the same from any database"
)
def test_archive_names_no_person(homes: Homes, tmp_path: Path) -> None:
    """Searched byte by byte in every member, and in every decoded Parquet value too (a
    compressed column could hide a name from a byte search)."""
    path = tmp_path / "study.tar"
    _archive(homes.source, homes.world.study_id, path)
    assert homes.world.secrets
    raw = path.read_bytes()
    with tarfile.open(path) as tar:
        texts = [raw]
        for member in tar.getmembers():
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            texts.append(data)
            if member.name.endswith(".parquet"):
                rows = pq.read_table(io.BytesIO(data)).to_pylist()
                texts.append(json.dumps(rows, default=str).encode())
    for secret in homes.world.secrets:
        assert not [t for t in texts if secret in t], secret
    everything = b"".join(texts)
    assert NOTE.encode() not in everything and RECORDING not in everything
    with open_archive(path) as archive:
        participants = pq.read_table(io.BytesIO(archive.read("tables/participants.parquet")))
        assert {"display_name", "user_id"}.isdisjoint(participants.column_names)
        assert all(p.startswith("P-") for p in participants.column("pseudonym").to_pylist())
        assert not archive.has("tables/terminal_recordings.parquet")
        assert "left out" in archive.read("README.md").decode()


@pytest.mark.sqlite_only("what is checked is what the exporter chose to include")
def test_notes_and_recordings_only_when_asked(homes: Homes, tmp_path: Path) -> None:
    path = tmp_path / "full.tar"
    _archive(homes.source, homes.world.study_id, path, notes=True, recordings=True)
    with open_archive(path) as archive:
        pauses = pq.read_table(io.BytesIO(archive.read("tables/pauses.parquet"))).to_pylist()
        assert NOTE in [p["note"] for p in pauses]
    target = homes.fresh()
    imported = _import(target, path)
    with target.session() as session:
        recorded = session.scalars(
            select(TerminalRecording.content)
            .join(Attempt)
            .where(Attempt.study_id == imported.study_id)
        ).all()
    assert recorded == [RECORDING]


@pytest.mark.sqlite_only("what is checked is the archive file, before any row is written")
def test_a_changed_missing_or_added_file_is_refused_by_name(homes: Homes, tmp_path: Path) -> None:
    path = tmp_path / "study.tar"
    exported = _archive(homes.source, homes.world.study_id, path)
    blob = next(f.path for f in exported.manifest.files if f.path.startswith("blobs/"))
    target = homes.fresh()
    for n, member in enumerate(["tables/gradings.parquet", "results/tidy.parquet", blob]):
        tampered = tmp_path / f"changed{n}.tar"
        archive_world.rewrite_member(path, member, tampered)
        with pytest.raises(ArchiveInvalid, match=re.escape(f"{member} was changed")):
            _import(target, tampered)
    with tarfile.open(path) as src, tarfile.open(tmp_path / "less.tar", "w") as less:
        for info in src.getmembers():
            if info.name != "tables/pauses.parquet":
                less.addfile(info, src.extractfile(info))
    with pytest.raises(
        ArchiveInvalid, match=r"tables/pauses\.parquet is listed .* not in the archive"
    ):
        _import(target, tmp_path / "less.tar")
    shutil.copyfile(path, tmp_path / "more.tar")
    with tarfile.open(tmp_path / "more.tar", "a") as more:
        extra = tarfile.TarInfo("tables/extra.parquet")
        extra.size = 3
        more.addfile(extra, io.BytesIO(b"abc"))
    with pytest.raises(ArchiveInvalid, match=r"tables/extra\.parquet is not listed"):
        _import(target, tmp_path / "more.tar")
    with target.session() as session:
        assert session.scalar(select(func.count()).select_from(Study)) == 0


@pytest.mark.sqlite_only("the refusal is decided by the audit trail, not the storage")
def test_the_same_archive_twice_is_refused_and_nothing_changes(
    homes: Homes, tmp_path: Path
) -> None:
    path = tmp_path / "study.tar"
    _archive(homes.source, homes.world.study_id, path)
    target = homes.fresh()
    first = _import(target, path)

    def counts() -> tuple[int | None, ...]:
        with target.session() as session:
            return tuple(
                session.scalar(select(func.count()).select_from(m))
                for m in (Study, Attempt, Snapshot)
            )

    before = counts()
    with pytest.raises(Conflict, match=f"imported already \\(study {first.study_id}\\)"):
        _import(target, path)
    assert counts() == before
    # a new archive of the same study meets the study's name
    again = tmp_path / "again.tar"
    _archive(homes.source, homes.world.study_id, again)
    with pytest.raises(Conflict, match="exists in this home"):
        _import(target, again)
    assert counts() == before


@pytest.mark.sqlite_only("task matching is decided by slug and content hash, not the storage")
def test_a_task_already_here_is_reused_if_identical_and_refused_if_not(
    homes: Homes, tmp_path: Path
) -> None:
    path = tmp_path / "study.tar"
    _archive(homes.source, homes.world.study_id, path)
    with homes.source.session() as session:
        first = session.scalars(
            select(Task).join(StudyTask).where(StudyTask.study_id == homes.world.study_id)
        ).first()
        assert first is not None
        slug, title, kind, content = first.slug, first.title, first.kind, first.content_hash
    for content_hash, refused in ((content[::-1], True), (content, False)):
        target = homes.fresh()
        with target.session() as session:
            here = Task(slug=slug, title=title, kind=kind, content_hash=content_hash)
            session.add(here)
            session.flush()
            here_id = here.id
        if refused:
            with pytest.raises(Conflict, match=f"task '{slug}' exists in this home with other"):
                _import(target, path)
            with target.session() as session:
                assert session.scalar(select(func.count()).select_from(Study)) == 0
            continue
        imported = _import(target, path)
        assert here_id in imported.ids["tasks"].values()


@pytest.mark.sqlite_only("what is checked is which work the worker takes up, not the storage")
def test_an_imported_study_is_a_record_the_worker_runs_nothing_for(
    homes: Homes, tmp_path: Path
) -> None:
    """Its snapshots lacking a reproduction or a score would otherwise be reproduced and scored
    again in the importing home (and its queued jobs run), on other hardware, by another judge."""
    path = tmp_path / "study.tar"
    _archive(homes.source, homes.world.study_id, path)
    target = homes.fresh()
    imported = _import(target, path)
    with target.session() as session:
        study = session.get(Study, imported.study_id)
        assert study is not None and study.status is StudyStatus.ARCHIVED
        # snapshots captured from a workspace (the seeded ones are drawn from a model, which
        # the worker leaves alone in any study)
        real = session.scalars(
            select(Snapshot).join(Attempt).where(Attempt.study_id == study.id).limit(3)
        ).all()
        for snapshot in real:
            snapshot.source = "workspace"
        for snapshot in real:  # as if the source home had not got to them yet
            for job in (Reproduction, Grading):
                for row in session.scalars(select(job).where(job.snapshot_id == snapshot.id)):
                    session.delete(row)
        session.flush()
        session.add(Reproduction(snapshot_id=real[0].id, status=JobStatus.QUEUED, details={}))
    found = orchestration.discover(target)
    assert not (found.reproductions or found.judge_gradings or found.script_gradings)
    assert orchestration.process_queue(target).summary().startswith("0 reproduction(s), 0 grad")
    with target.session() as session:  # the control: the same rows in a study that is not a record
        study = session.get(Study, imported.study_id)
        assert study is not None
        study.status = StudyStatus.CLOSED
    found = orchestration.discover(target)
    assert found.reproductions or found.script_gradings


@pytest.mark.sqlite_only("the refusal is decided before anything is read from the storage")
def test_a_study_with_attempts_under_way_is_not_archived(homes: Homes, tmp_path: Path) -> None:
    with homes.source.session() as session:
        attempt = session.scalars(
            select(Attempt).where(Attempt.study_id == homes.world.study_id)
        ).first()
        assert attempt is not None
        attempt.status = AttemptStatus.RUNNING
        running = attempt.id
    with pytest.raises(Conflict, match=f"attempt {running} \\(running\\)"):
        _archive(homes.source, homes.world.study_id, tmp_path / "live.tar")
    assert not (tmp_path / "live.tar").exists()
