"""A study archived, imported into a fresh home and analysed there gives the same numbers; the
archive names no person; a changed file is refused by name; the same archive twice is refused;
the monitor's records travel without their secrets, and an archive of the first schema imports."""

from __future__ import annotations

import hashlib
import io
import json
import re
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
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
    Alert,
    AlertDelivery,
    AlertRule,
    Attempt,
    AttemptStatus,
    Grading,
    Host,
    JobStatus,
    MonitorSettings,
    Participant,
    ParticipantKind,
    Reproduction,
    Snapshot,
    Study,
    StudyStatus,
    StudyTask,
    Task,
    TerminalRecording,
    User,
    WorkspacePurpose,
    WorkspaceStatus,
)
from baseline.monitor import alerts, delivery, rules
from baseline.monitor import settings as monitor_settings
from baseline.monitor.board import (
    AttemptView,
    Board,
    HostView,
    MissingCheckpoint,
    QueueView,
    SpendView,
)
from baseline.studies import studies
from baseline.workspaces.workspaces import new_workspace_name
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
        ended, attempt.status = attempt.status, AttemptStatus.RUNNING
        running = attempt.id
        # and one created that never launched (a closed study launches none)
        study = attempt.study
        studies.set_status(session, study, StudyStatus.ACTIVE, None)
        pending = studies.create_attempt(session, attempt.participant, attempt.task, None).id
        studies.set_status(session, study, StudyStatus.CLOSED, None)
    with pytest.raises(Conflict, match=f"attempt {running} \\(running\\)\\)"):
        _archive(homes.source, homes.world.study_id, tmp_path / "live.tar")
    assert not (tmp_path / "live.tar").exists()
    # Ended, the study is archived with its attempt that never started, imported as such (it
    # was refused, and no action ends a pending attempt: such a study could not be archived).
    with homes.source.session() as session:
        attempt = session.get(Attempt, running)
        assert attempt is not None
        attempt.status = ended
    _archive(homes.source, homes.world.study_id, tmp_path / "ended.tar")
    target = homes.fresh()
    imported = _import(target, tmp_path / "ended.tar")
    with target.session() as session:
        never = session.get(Attempt, imported.ids["attempts"][pending])
        assert never is not None and never.status is AttemptStatus.PENDING
        assert never.started_at is None and never.study.status is StudyStatus.ARCHIVED


# The monitor's records: settings, alerts and their deliveries travel; secrets and people do not.
WEBHOOK = "https://hooks.chat.example/services/T0/B0/TOKEN-sekrit-path?key=sekrit-query"
SMTP_URL = "smtps://mailer:hunter2-smtp-password@mail.lab.example:465"
RECIPIENTS = ["cordelia.91@private-mail.example", "lab-alerts@lab.example"]


@dataclass
class Monitored:
    webhook_secret: str
    alert_ids: list[int]
    display_name: str
    pseudonym: str


def _monitor(ctx: Context, study_id: int, monkeypatch: pytest.MonkeyPatch) -> Monitored:
    """Settings saved, alerts fired, cleared and acknowledged, and delivered, by the monitor's
    own functions (the webhook's POST faked; the e-mail refused for its SMTP URL, whose error
    quotes the URL with its password)."""
    monkeypatch.setenv("BASELINE_SMTP_URL", SMTP_URL)
    monkeypatch.setattr(
        delivery, "post_webhook", lambda url, secret, data: delivery.Outcome(2, True, None)
    )
    fired = datetime(2025, 3, 4, 10, 15, 30, 123456, tzinfo=UTC)
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None and study.created_by_id is not None
        coordinator = session.get(User, study.created_by_id)
        assert coordinator is not None
        config = monitor_settings.MonitorConfig(
            budget_usd=250.5,
            thresholds=monitor_settings.Thresholds(idle_minutes=45.0, failure_rate=None),
            email_to=RECIPIENTS,
            webhook_url=WEBHOOK,
        )
        secret = monitor_settings.save(session, study, config, coordinator.id)
        assert secret is not None
        attempt, person = session.execute(
            select(Attempt, Participant)
            .join(Participant)
            .where(Attempt.study_id == study_id, Participant.kind == ParticipantKind.HUMAN)
            .order_by(Attempt.id)
        ).first()  # type: ignore[misc]
        made = [
            Alert(
                study_id=study_id,
                rule=AlertRule.IDLE,
                subject=f"attempt:{attempt.id}",
                message=f"attempt {attempt.id} ({person.display_name}, t): no activity",
                fired_at=fired,
                cleared_at=fired + timedelta(minutes=20),
            ),
            Alert(
                study_id=study_id,
                rule=AlertRule.SPEND,
                subject="study",
                message="spend $210 of $250.5",
                fired_at=fired + timedelta(hours=1),
            ),
        ]
        session.add_all(made)
        session.flush()
        alerts.acknowledge(session, study_id, made[0].id, coordinator)
        for alert, event in ((made[0], "fired"), (made[0], "cleared"), (made[1], "fired")):
            delivery.deliver(session, alert, event)
        return Monitored(secret, [a.id for a in made], person.display_name, person.pseudonym)


def _rows(session: Any, model: Any, where: Any) -> list[dict[str, Any]]:
    return [
        {c.key: getattr(row, c.key) for c in model.__table__.columns}
        for row in session.scalars(
            select(model).where(where).order_by(*model.__table__.primary_key)
        )
    ]


@pytest.mark.sqlite_only(
    "the monitor's columns are encoded by the code the round trip above runs on both databases"
)
def test_monitor_records_round_trip(
    homes: Homes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every archived column of the monitor's settings, alerts and deliveries arrives as it was
    (ids translated, an attempt subject and message too); what is left out is exactly the
    secrets and the people: the webhook's key, the recipients, who acknowledged, URLs past their
    host."""
    study_id = homes.world.study_id
    seeded = _monitor(homes.source, study_id, monkeypatch)
    with homes.source.session() as session:
        settings_before = _rows(session, MonitorSettings, MonitorSettings.study_id == study_id)
        alerts_before = _rows(session, Alert, Alert.study_id == study_id)
        deliveries_before = _rows(
            session, AlertDelivery, AlertDelivery.alert_id.in_(seeded.alert_ids)
        )
    assert len(deliveries_before) == 6  # e-mail and webhook, for three firings and clearings
    path = tmp_path / "study.tar"
    _archive(homes.source, study_id, path)
    target = homes.fresh()
    imported = _import(target, path)
    new_study = imported.study_id
    with target.session() as session:
        settings_after = _rows(session, MonitorSettings, MonitorSettings.study_id == new_study)
        alerts_after = _rows(session, Alert, Alert.study_id == new_study)
        deliveries_after = _rows(
            session,
            AlertDelivery,
            AlertDelivery.alert_id.in_(select(Alert.id).where(Alert.study_id == new_study)),
        )

    (settings,) = settings_before
    settings |= {
        "study_id": new_study,
        "webhook_url": "https://hooks.chat.example",
        "webhook_secret": None,
        "email_to": [],
        "updated_by_id": None,
    }
    assert settings_after == [settings]
    alert_ids = imported.ids["alerts"]
    attempt_ids = imported.ids["attempts"]
    expected_alerts = []
    for alert in alerts_before:
        assert alert["fired_at"] is not None
        subject, message = alert["subject"], alert["message"]
        if subject.startswith("attempt:"):
            old = int(subject.split(":")[1])
            subject = f"attempt:{attempt_ids[old]}"
            message = message.replace(f"attempt {old} ", f"attempt {attempt_ids[old]} ", 1)
        expected_alerts.append(
            alert
            | {
                "id": alert_ids[alert["id"]],
                "study_id": new_study,
                "subject": subject,
                "message": message.replace(seeded.display_name, seeded.pseudonym),
                "acknowledged_by_id": None,
            }
        )
    assert alerts_before[0]["acknowledged_at"] is not None
    assert alerts_after == expected_alerts
    expected_deliveries = []
    for sent in deliveries_before:
        email = sent["channel"] == "email"
        expected_deliveries.append(
            sent
            | {
                "id": imported.ids["alert_deliveries"][sent["id"]],
                "alert_id": alert_ids[sent["alert_id"]],
                "target": "<e-mail address>, <e-mail address>"
                if email
                else "https://hooks.chat.example",
                "error": "BASELINE_SMTP_URL must be smtp://host:port, not "
                "'smtps://mail.lab.example:465'"
                if email
                else None,
            }
        )
    assert {d["channel"] for d in deliveries_before} == {"email", "webhook"}
    assert deliveries_after == expected_deliveries


@pytest.mark.sqlite_only(
    "what is checked is the archive's bytes, written the same from any database"
)
def test_monitor_records_archive_no_secret_and_no_person(
    homes: Homes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeded = _monitor(homes.source, homes.world.study_id, monkeypatch)
    path = tmp_path / "study.tar"
    _archive(homes.source, homes.world.study_id, path)
    secrets = [
        seeded.webhook_secret,
        "TOKEN-sekrit-path",
        "sekrit-query",
        "hunter2-smtp-password",
        "mailer",
        *RECIPIENTS,
        seeded.display_name,
    ]
    everything = b""
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            everything += data
            if member.name.endswith(".parquet"):
                rows = pq.read_table(io.BytesIO(data)).to_pylist()
                everything += json.dumps(rows, default=str).encode()
    for secret in secrets:
        assert secret.encode() not in everything, secret
    with open_archive(path) as archive:
        table = pq.read_table(io.BytesIO(archive.read("tables/monitor_settings.parquet")))
        assert {"webhook_secret", "email_to", "updated_by_id"}.isdisjoint(table.column_names)
        alerted = pq.read_table(io.BytesIO(archive.read("tables/alerts.parquet"))).to_pylist()
        assert seeded.pseudonym in alerted[0]["message"]
        assert "webhook_secret" in archive.read("README.md").decode()


def _as_first_schema(path: Path, out: Path) -> None:
    """The archive as Baseline wrote it before the monitor's tables were archived: without
    them, in the manifest or the tar, and with schema version 1."""
    added = {
        f"tables/{name}.parquet" for name in ("monitor_settings", "alerts", "alert_deliveries")
    }
    with tarfile.open(path) as src, tarfile.open(out, "w") as dst:
        for info in src.getmembers():
            data = src.extractfile(info).read()  # type: ignore[union-attr]
            if info.name in added:
                continue
            if info.name == "manifest.json":
                manifest = json.loads(data)
                assert manifest["schema_version"] == 2
                manifest["schema_version"] = 1
                manifest["files"] = [f for f in manifest["files"] if f["path"] not in added]
                data = json.dumps(manifest).encode()
                info.size = len(data)
            dst.addfile(info, io.BytesIO(data))


@pytest.mark.sqlite_only("what is checked is which tables an archive must hold, not the storage")
def test_an_archive_of_the_first_schema_imports_and_a_newer_one_must_hold_the_monitor(
    homes: Homes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _monitor(homes.source, homes.world.study_id, monkeypatch)
    path = tmp_path / "study.tar"
    _archive(homes.source, homes.world.study_id, path)
    old = tmp_path / "v1.tar"
    _as_first_schema(path, old)
    target = homes.fresh()
    imported = _import(target, old)
    with target.session() as session:
        study = session.get(Study, imported.study_id)
        assert study is not None and study.status is StudyStatus.ARCHIVED
        assert session.scalar(select(func.count()).select_from(Alert)) == 0
        assert monitor_settings.load(session, imported.study_id) == monitor_settings.MonitorConfig()
    # the same files claiming the current schema: the monitor's tables are missing, refused
    with tarfile.open(old) as src, tarfile.open(tmp_path / "v2-less.tar", "w") as dst:
        for info in src.getmembers():
            data = src.extractfile(info).read()  # type: ignore[union-attr]
            if info.name == "manifest.json":
                data = data.replace(b'"schema_version": 1', b'"schema_version": 2')
                info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    with pytest.raises(ArchiveInvalid, match=r"lacks tables/monitor_settings\.parquet"):
        _import(homes.fresh(), tmp_path / "v2-less.tar")


@pytest.mark.sqlite_only("what is checked is the archive file, before any row is written")
def test_a_changed_blob_is_refused_when_read_and_opening_hashes_no_blob(
    homes: Homes, tmp_path: Path
) -> None:
    """Opening hashes the tables but no blob, so a reader of the tables does not hash the whole
    archive; a changed blob is refused, by name, each time it is read, and by `verify`."""
    path = tmp_path / "study.tar"
    exported = _archive(homes.source, homes.world.study_id, path)
    blob = next(f.path for f in exported.manifest.files if f.path.startswith("blobs/"))
    tampered = tmp_path / "changed-blob.tar"
    archive_world.rewrite_member(path, blob, tampered)
    changed = re.escape(f"{blob} was changed")
    with open_archive(tampered) as archive:
        studies = pq.read_table(io.BytesIO(archive.read("tables/studies.parquet")))
        assert studies.column("name").to_pylist() == [exported.manifest.study.name]
        for _ in range(2):
            with pytest.raises(ArchiveInvalid, match=changed):
                archive.read(blob)
        with pytest.raises(ArchiveInvalid, match=changed):
            archive.verify()
    archive_world.rewrite_member(path, "tables/gradings.parquet", tampered)
    with pytest.raises(ArchiveInvalid, match=re.escape("tables/gradings.parquet was changed")):
        open_archive(tampered)
    with open_archive(path) as archive:
        archive.verify()
        assert archive.read(blob) == store_for(homes.source).get_bytes(blob.split("/")[1])


def _with_records(
    path: Path, out: Path, member: str, change: Callable[[list[dict[str, Any]]], None]
) -> None:
    """A copy of the archive at `path` whose Parquet `member` has its records changed by
    `change`, listed in the manifest with its new size and sha256: an archive as an exporter could
    have written it, which only the import's own checks of the rows can refuse."""
    with tarfile.open(path) as src:
        infos = src.getmembers()
        contents = {info.name: src.extractfile(info).read() for info in infos}  # type: ignore[union-attr]
    table = pq.read_table(io.BytesIO(contents[member]))
    records = table.to_pylist()
    change(records)
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records, schema=table.schema), sink)
    contents[member] = sink.getvalue()
    manifest = json.loads(contents["manifest.json"])
    (listed,) = [f for f in manifest["files"] if f["path"] == member]
    listed |= {"size": len(sink.getvalue()), "sha256": hashlib.sha256(sink.getvalue()).hexdigest()}
    contents["manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(out, "w") as dst:
        for info in infos:
            info.size = len(contents[info.name])
            dst.addfile(info, io.BytesIO(contents[info.name]))


@pytest.mark.sqlite_only("what is checked is the archive file, before any row is written")
def test_an_alert_naming_an_attempt_the_archive_lacks_is_refused_and_nothing_is_written(
    homes: Homes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeded = _monitor(homes.source, homes.world.study_id, monkeypatch)
    path = tmp_path / "study.tar"
    exported = _archive(homes.source, homes.world.study_id, path)
    with homes.source.session() as session:
        missing = 1 + max(session.scalars(select(Attempt.id)))
    about = seeded.alert_ids[0]  # the idle alert: an attempt's subject and message

    def subject(records: list[dict[str, Any]]) -> None:
        (alert,) = [r for r in records if r["id"] == about]
        alert["subject"] = f"attempt:{missing}"

    def message(records: list[dict[str, Any]]) -> None:
        (alert,) = [r for r in records if r["id"] == about]
        alert["message"] = f"attempt {missing} (P-x, t): no activity"

    target = homes.fresh()
    for n, (change, says) in enumerate(((subject, "is about"), (message, "has a message naming"))):
        crafted = tmp_path / f"crafted{n}.tar"
        _with_records(path, crafted, "tables/alerts.parquet", change)
        refusal = f"tables/alerts.parquet row {about} {says} attempt {missing}, which the archive"
        with pytest.raises(ArchiveInvalid, match=re.escape(refusal)):
            _import(target, crafted)
        with target.session() as session:
            for model in (Study, Attempt, Alert):
                assert session.scalar(select(func.count()).select_from(model)) == 0
        blobs = [f.path for f in exported.manifest.files if f.path.startswith("blobs/")]
        assert not any(store_for(target).exists(b.removeprefix("blobs/")) for b in blobs)
    _import(target, path)  # the archive as written imports


# A host's name and its SSH and Docker errors: the machine's address, a user, a port, a key path.
HOST_NAME = "gpu7.cluster.lab.example"
HOST_ERROR = (
    "ssh: connect to host 10.20.30.40 port 2222: Connection refused; Load key "
    '"/home/trainer/.ssh/id_ed25519": invalid format; trainer@10.20.30.40: Permission denied '
    "(publickey); Cannot connect to the Docker daemon at unix:///var/run/docker.sock"
)
HOST_SECRETS = [HOST_NAME, "10.20.30.40", "port 2222", "trainer", "id_ed25519", "docker.sock"]


def _rule_alerts(ctx: Context, study_id: int) -> tuple[int, int, str]:
    """An unhealthy host, and the alerts the monitor's own rules raise for it and for one of the
    study's attempts (its workspace dead on that host, idle, a checkpoint late), saved; the
    host's id, the attempt's id and its workspace's name."""
    now = datetime(2025, 3, 4, 10, 0, tzinfo=UTC)
    with ctx.session() as session:
        host = Host(
            name=HOST_NAME,
            docker_url="ssh://trainer@10.20.30.40:2222",
            healthy=False,
            last_checked_at=now,
            last_error=HOST_ERROR,
        )
        session.add(host)
        session.flush()
        attempt, person, task = session.execute(
            select(Attempt, Participant, Task)
            .join(Participant, Participant.id == Attempt.participant_id)
            .join(Task, Task.id == Attempt.task_id)
            .where(Attempt.study_id == study_id)
            .order_by(Attempt.id)
        ).first()  # type: ignore[misc]
        workspace = new_workspace_name(WorkspacePurpose.ATTEMPT, attempt)
        board = Board.model_construct(
            attempts=[
                AttemptView.model_construct(
                    id=attempt.id,
                    participant=person.display_name,
                    task=task.slug,
                    status=AttemptStatus.RUNNING.value,
                    workspace=workspace,
                    workspace_status=WorkspaceStatus.DEAD.value,
                    host=HOST_NAME,
                    idle_working_s=3 * 3600.0,
                    hub_activity_unknown=None,
                    missing_checkpoints=[
                        MissingCheckpoint(due_working_s=3600.0, overdue_working_s=7200.0)
                    ],
                )
            ],
            hosts=[
                HostView.model_construct(
                    id=host.id,
                    name=HOST_NAME,
                    enabled=True,
                    healthy=False,
                    last_checked_at=now,
                    last_error=HOST_ERROR,
                )
            ],
            queue=QueueView.model_construct(oldest_age_s=None),
            spend=SpendView.model_construct(share=None),
        )
        limits = monitor_settings.Thresholds(
            idle_minutes=45.0, failure_rate=None, queue_minutes=None, spend_share=None
        )
        found = rules.conditions(board, limits)
        assert sorted(c.rule.value for c in found) == [
            "host_down",
            "idle",
            "snapshot_late",
            "workspace_dead",
        ]
        assert all(HOST_NAME in c.message for c in found if c.subject.startswith("host"))
        session.add_all(
            Alert(
                study_id=study_id, rule=c.rule, subject=c.subject, message=c.message, fired_at=now
            )
            for c in found
        )
        return host.id, attempt.id, workspace


@pytest.mark.sqlite_only(
    "what is checked is the archive's bytes, written the same from any database"
)
def test_alerts_name_a_host_by_its_id_without_its_name_or_error(
    homes: Homes, tmp_path: Path
) -> None:
    """A host_down alert says which host was down (as its subject names it) and since when, not
    the host's error; a workspace_dead alert which host, not the host's name or the workspace's."""
    host_id, attempt_id, workspace = _rule_alerts(homes.source, homes.world.study_id)
    path = tmp_path / "study.tar"
    _archive(homes.source, homes.world.study_id, path)
    everything = b""
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            everything += data
            if member.name.endswith(".parquet"):
                rows = pq.read_table(io.BytesIO(data)).to_pylist()
                everything += json.dumps(rows, default=str).encode()
    for secret in [*HOST_SECRETS, workspace]:
        assert secret.encode() not in everything, secret
    with open_archive(path) as archive:
        table = pq.read_table(io.BytesIO(archive.read("tables/alerts.parquet")))
        messages = {r["rule"]: r["message"] for r in table.to_pylist()}
    assert messages["host_down"] == f"host {host_id} is down (its error is not archived)"
    assert messages["workspace_dead"].startswith(f"attempt {attempt_id} (P-")
    assert messages["workspace_dead"].endswith(
        f"workspace on host {host_id} is dead, not restarted"
    )


@pytest.mark.sqlite_only("the ids are translated by the code the round trip runs on both databases")
def test_imported_alert_messages_name_attempts_by_this_homes_ids(
    homes: Homes, tmp_path: Path
) -> None:
    """Each message about an attempt names it as its subject does, in the importing home, whose
    ids differ from the exporting home's (an earlier copy of the study was imported there)."""
    target = homes.fresh()
    _import(target, _archive(homes.source, homes.world.study_id, tmp_path / "earlier.tar").path)
    with target.session() as session:
        earlier = session.scalars(select(Study)).one()
        earlier.name = "an earlier copy"
    _, attempt_id, _ = _rule_alerts(homes.source, homes.world.study_id)
    imported = _import(
        target, _archive(homes.source, homes.world.study_id, tmp_path / "s.tar").path
    )
    here = imported.ids["attempts"][attempt_id]
    assert here != attempt_id
    with target.session() as session:
        about = session.scalars(
            select(Alert).where(
                Alert.study_id == imported.study_id, Alert.subject == f"attempt:{here}"
            )
        ).all()
    assert sorted(a.rule.value for a in about) == ["idle", "snapshot_late", "workspace_dead"]
    for alert in about:
        assert alert.message.startswith(f"attempt {here} (P-"), alert.message
