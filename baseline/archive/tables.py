"""Which database rows of a study an archive carries, and how a row becomes a Parquet record and
back, exactly (times as ISO text with their zone, enumerations by value, JSON as text).

One list, `TABLES`, in the order an import must insert them (each table after the ones its
foreign keys name), is shared by the exporter and the importer so the two cannot disagree.
Columns that identify a person (names, e-mail addresses, account ids) and secrets (the webhook's
signing key) are never written; free-text notes are blanked unless the exporter asks for them.
Tables added after the first archive schema say since which version (`TableSpec.since`), so an
older archive, which lacks them, still imports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
from sqlalchemy import JSON, Boolean, Column, Enum, Float, Integer, LargeBinary, Select, select
from sqlalchemy.orm import DeclarativeBase

from baseline.models import (
    AgentRun,
    Alert,
    AlertDelivery,
    Attempt,
    Grading,
    GradingKind,
    LeafGrade,
    ModelCall,
    MonitorSettings,
    Participant,
    Pause,
    Reproduction,
    ScoreLog,
    Snapshot,
    Study,
    StudyTask,
    Task,
    TaskFile,
    TerminalRecording,
    TranscriptEntry,
    UTCDateTime,
)

# Columns that name or point at a person's account: never in an archive.
PERSONAL: dict[str, frozenset[str]] = {
    "studies": frozenset({"created_by_id"}),
    "participants": frozenset({"display_name", "user_id"}),
    "gradings": frozenset({"grader_id"}),
    "monitor_settings": frozenset({"email_to", "updated_by_id"}),
    "alerts": frozenset({"acknowledged_by_id"}),
}
# Secrets: never in an archive (the webhook receiver's HMAC key signs requests as this home).
SECRET: dict[str, frozenset[str]] = {"monitor_settings": frozenset({"webhook_secret"})}
# Free text people typed: blanked unless the export includes notes.
NOTES: dict[str, frozenset[str]] = {"pauses": frozenset({"note"})}
# The terminal recordings' bytes travel as blobs; the table names their sha256.
RECORDING_BLOB_COLUMN = "content"


@dataclass(frozen=True)
class TableSpec:
    """One exported table: its model and the query for one study's rows (ordered by id)."""

    model: type[DeclarativeBase]
    recordings: bool = False  # only with --include-recordings
    since: int = 1  # the archive schema version that added the table

    @property
    def name(self) -> str:
        return str(self.model.__tablename__)

    @property
    def key(self) -> str:
        """The primary key's column: ``id``, or the study's id for a row per study."""
        table: Any = self.model.__table__
        (column,) = table.primary_key.columns
        return str(column.key)

    @property
    def file(self) -> str:
        return f"tables/{self.name}.parquet"

    def columns(self) -> list[Column[Any]]:
        skip = PERSONAL.get(self.name, frozenset()) | SECRET.get(self.name, frozenset())
        table: Any = self.model.__table__
        return [c for c in table.columns if c.key not in skip]


TABLES: tuple[TableSpec, ...] = (
    TableSpec(Study),
    TableSpec(Task),
    TableSpec(TaskFile),
    TableSpec(StudyTask),
    TableSpec(Participant),
    TableSpec(Attempt),
    TableSpec(Pause),
    TableSpec(Snapshot),
    TableSpec(Reproduction),
    TableSpec(Grading),
    TableSpec(LeafGrade),
    TableSpec(ModelCall),
    TableSpec(ScoreLog),
    TableSpec(AgentRun),
    TableSpec(TranscriptEntry),
    TableSpec(TerminalRecording, recordings=True),
    TableSpec(MonitorSettings, since=2),
    TableSpec(Alert, since=2),
    TableSpec(AlertDelivery, since=2),
)


def study_rows(spec: TableSpec, study_id: int) -> Select[Any]:
    """The query for the study's rows of one table (the archived columns, by id)."""
    attempts = select(Attempt.id).where(Attempt.study_id == study_id)
    snapshots = select(Snapshot.id).where(Snapshot.attempt_id.in_(attempts))
    tasks = select(StudyTask.task_id).where(StudyTask.study_id == study_id)
    wheres: dict[str, Any] = {
        "studies": Study.id == study_id,
        "tasks": Task.id.in_(
            tasks.union(select(Attempt.task_id).where(Attempt.study_id == study_id))
        ),
        "task_files": TaskFile.task_id.in_(tasks),
        "study_tasks": StudyTask.study_id == study_id,
        "participants": Participant.study_id == study_id,
        "attempts": Attempt.study_id == study_id,
        "pauses": Pause.attempt_id.in_(attempts),
        "snapshots": Snapshot.attempt_id.in_(attempts),
        "reproductions": Reproduction.snapshot_id.in_(snapshots),
        "gradings": Grading.snapshot_id.in_(snapshots),
        "leaf_grades": LeafGrade.grading_id.in_(
            select(Grading.id).where(Grading.snapshot_id.in_(snapshots))
        ),
        "model_calls": (ModelCall.study_id == study_id) | ModelCall.attempt_id.in_(attempts),
        "score_logs": ScoreLog.attempt_id.in_(attempts),
        "agent_runs": AgentRun.attempt_id.in_(attempts),
        "transcript_entries": TranscriptEntry.run_id.in_(
            select(AgentRun.id).where(AgentRun.attempt_id.in_(attempts))
        ),
        "terminal_recordings": TerminalRecording.attempt_id.in_(attempts),
        "monitor_settings": MonitorSettings.study_id == study_id,
        "alerts": Alert.study_id == study_id,
        "alert_deliveries": AlertDelivery.alert_id.in_(
            select(Alert.id).where(Alert.study_id == study_id)
        ),
    }
    model: Any = spec.model
    return select(*spec.columns()).where(wheres[spec.name]).order_by(getattr(model, spec.key))


def arrow_type(column: Column[Any]) -> pa.DataType:
    kind = column.type
    if isinstance(kind, Boolean):
        return pa.bool_()
    if isinstance(kind, Integer):
        return pa.int64()
    if isinstance(kind, Float):
        return pa.float64()
    return pa.string()  # text, enumerations, times (ISO), JSON (text), blobs (their sha256)


def schema(spec: TableSpec) -> pa.Schema:
    return pa.schema([pa.field(c.key, arrow_type(c)) for c in spec.columns()])


def expert_gradings(study_id: int) -> Select[Any]:
    """The ids of the study's expert gradings, whose leaf notes are the graders' own text."""
    attempts = select(Attempt.id).where(Attempt.study_id == study_id)
    snapshots = select(Snapshot.id).where(Snapshot.attempt_id.in_(attempts))
    return select(Grading.id).where(
        Grading.snapshot_id.in_(snapshots), Grading.kind == GradingKind.EXPERT
    )


def to_record(
    spec: TableSpec, row: Any, *, blank: frozenset[str], blob: dict[str, str]
) -> dict[str, Any]:
    """One row as a Parquet record, the `blank` columns (notes left out) as empty text; `blob`
    names the recording bytes' sha256 by column."""
    return {
        column.key: "" if column.key in blank else _encode(column, row[column.key], blob)
        for column in spec.columns()
    }


def notes_of(spec: TableSpec, row: Any, experts: set[int]) -> frozenset[str]:
    """The columns of `row` that hold free text a person typed: pause notes, and an expert's
    note on a leaf (a judge's explanation is data, and stays)."""
    if spec.name == "leaf_grades" and row["grading_id"] in experts:
        return frozenset({"explanation"})
    return NOTES.get(spec.name, frozenset())


def _encode(column: Column[Any], value: Any, blob: dict[str, str]) -> Any:
    if value is None:
        return None
    kind = column.type
    if isinstance(kind, LargeBinary):
        return blob[column.key]
    if isinstance(kind, UTCDateTime):
        return value.isoformat()
    if isinstance(kind, Enum):
        return value.value
    if isinstance(kind, JSON):
        return json.dumps(value, sort_keys=True)
    return value


def from_record(spec: TableSpec, record: dict[str, Any], blobs: dict[str, bytes]) -> dict[str, Any]:
    """A Parquet record back into the model's attribute values (foreign keys still the archive's;
    `blobs` maps a recording's sha256 to its bytes)."""
    out: dict[str, Any] = {}
    for column in spec.columns():
        value = record.get(column.key)
        kind = column.type
        if value is None:
            out[column.key] = None
        elif isinstance(kind, LargeBinary):
            out[column.key] = blobs[value]
        elif isinstance(kind, UTCDateTime):
            out[column.key] = datetime.fromisoformat(value)
        elif isinstance(kind, Enum):
            enum_class: Any = kind.enum_class
            out[column.key] = enum_class(value)
        elif isinstance(kind, JSON):
            out[column.key] = json.loads(value)
        else:
            out[column.key] = value
    return out


def foreign_table(column: Column[Any]) -> str | None:
    """The table a foreign-key column points into, None for other columns."""
    for key in column.foreign_keys:
        return str(key.column.table.name)
    return None
