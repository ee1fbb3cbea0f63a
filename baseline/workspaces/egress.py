"""Egress events into the database: the proxy's JSON-lines log becomes `EgressEvent` rows.

The proxy runs in its own venv and never touches the database; it appends one JSON line per
request (see `infra.egress.rules.event_line`). `ingest` reads what was appended since the last call
(the byte offset is kept in `<log>.offset`, written after the rows are committed by the caller's
session scope) and records each line, tied to its workspace by name, so a refused request is
evidence with a time, a method and a URL. Incomplete last lines wait for the next call; lines that
are not events are reported, never dropped silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline.models import EgressEvent, EgressPolicy, Study, Workspace


class EgressLine(BaseModel):
    at: datetime
    workspace: str
    method: str
    url: str
    allowed: bool
    rule: str | None = None


@dataclass
class IngestReport:
    ingested: int = 0
    refused: int = 0
    offset: int = 0
    invalid: list[str] = field(default_factory=list)  # "line N: why"
    workspaces: set[str] = field(default_factory=set)  # those with new events: to monitor


def offset_path(log_path: Path) -> Path:
    return log_path.with_name(log_path.name + ".offset")


def read_offset(log_path: Path) -> int:
    path = offset_path(log_path)
    return int(path.read_text().strip() or 0) if path.exists() else 0


def ingest(session: Session, log_path: Path) -> IngestReport:
    """Record the events appended to `log_path` since the last call; returns what it did.

    Call inside a session scope and then `commit_offset(log_path, report)` once it committed: a
    crash in between replays the same lines rather than losing them.
    """
    start = read_offset(log_path)
    report = IngestReport(offset=start)
    if not log_path.exists():
        return report
    with log_path.open("rb") as handle:
        handle.seek(start)
        data = handle.read()
    complete = data[: data.rfind(b"\n") + 1]
    ids: dict[str, int | None] = {}
    line_number = _line_number(log_path, start)
    for raw in complete.splitlines():
        line_number += 1
        if not raw.strip():
            continue
        try:
            line = EgressLine.model_validate(json.loads(raw))
        except (json.JSONDecodeError, ValidationError, UnicodeDecodeError) as exc:
            report.invalid.append(f"line {line_number}: {str(exc).splitlines()[0][:200]}")
            continue
        if line.workspace not in ids:
            ids[line.workspace] = session.scalar(
                select(Workspace.id).where(Workspace.name == line.workspace)
            )
        session.add(
            EgressEvent(
                workspace_id=ids[line.workspace],
                workspace_name=line.workspace,
                at=line.at,
                method=line.method[:16],
                url=line.url,
                allowed=line.allowed,
                rule=line.rule,
            )
        )
        report.ingested += 1
        report.refused += 0 if line.allowed else 1
        report.workspaces.add(line.workspace)
    session.flush()
    report.offset = start + len(complete)
    return report


def _line_number(log_path: Path, offset: int) -> int:
    if offset == 0:
        return 0
    with log_path.open("rb") as handle:
        return handle.read(offset).count(b"\n")


def commit_offset(log_path: Path, report: IngestReport) -> None:
    """Remember how far the log was recorded (after the session committed)."""
    path = offset_path(log_path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(report.offset))
    tmp.replace(path)


def mode_for(study: Study) -> str:
    """The proxy mode of a study's workspaces."""
    return EgressPolicy(study.egress_policy).value


def events_for(session: Session, workspace_name: str) -> list[EgressEvent]:
    return list(
        session.scalars(
            select(EgressEvent)
            .where(EgressEvent.workspace_name == workspace_name)
            .order_by(EgressEvent.at, EgressEvent.id)
        )
    )
