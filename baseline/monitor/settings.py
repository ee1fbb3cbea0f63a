"""A study's monitor settings: its budget, each alert rule's threshold, where alerts go.

Stored per study (`MonitorSettings`), edited by a coordinator on the monitor page or through
`/api/v1`; a study without a row uses the defaults. Validated here, so the portal, the API and
the alert job read one shape.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy.orm import Session

from baseline import audit
from baseline.errors import InvalidInput
from baseline.models import MonitorSettings, Study, utcnow

_EMAIL = re.compile(r"^[^@\s,;<>]+@[^@\s,;<>]+\.[^@\s,;<>]+$")


class Thresholds(BaseModel):
    """Each rule's threshold; None (or False) turns the rule off."""

    model_config = ConfigDict(extra="forbid")

    workspace_dead: bool = True
    # Working minutes without activity while the clock runs.
    idle_minutes: float | None = Field(default=60.0, gt=0)
    # Working minutes a checkpoint may be overdue before its missing snapshot is an alert.
    snapshot_late_minutes: float | None = Field(default=30.0, ge=0)
    # Share of the latest finished reproductions (or gradings) failing, above which it fires...
    failure_rate: float | None = Field(default=0.5, ge=0, le=1)
    # ...once at least this many have finished (one failure in one is no rate).
    failure_min_count: int = Field(default=4, ge=1)
    # Wall minutes the oldest queued reproduction or grading may wait.
    queue_minutes: float | None = Field(default=60.0, gt=0)
    host_down: bool = True
    # Share of the study's budget spent (judge and agents) at which it fires.
    spend_share: float | None = Field(default=0.8, gt=0)


class MonitorConfig(BaseModel):
    """What a coordinator sets for a study's monitor."""

    model_config = ConfigDict(extra="forbid")

    budget_usd: float | None = Field(default=None, ge=0)
    thresholds: Thresholds = Field(default_factory=Thresholds)
    email_to: list[str] = Field(default_factory=list, max_length=20)
    webhook_url: str | None = Field(default=None, max_length=500)

    @field_validator("email_to")
    @classmethod
    def _emails(cls, value: list[str]) -> list[str]:
        cleaned = [v.strip() for v in value if v.strip()]
        bad = [v for v in cleaned if not _EMAIL.match(v)]
        if bad:
            raise ValueError(f"not an e-mail address: {', '.join(bad)}")
        return cleaned

    @field_validator("webhook_url")
    @classmethod
    def _webhook(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the webhook must be an http:// or https:// URL with a host")
        return value.strip()


def parse(data: object) -> MonitorConfig:
    """A MonitorConfig from user input, or InvalidInput naming each problem."""
    try:
        return MonitorConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in exc.errors()
        )
        raise InvalidInput(f"monitor settings: {problems}") from exc


def load(session: Session, study_id: int) -> MonitorConfig:
    row = session.get(MonitorSettings, study_id)
    if row is None:
        return MonitorConfig()
    return MonitorConfig(
        budget_usd=row.budget_usd,
        thresholds=Thresholds.model_validate(row.thresholds or {}),
        email_to=list(row.email_to or []),
        webhook_url=row.webhook_url,
    )


def version(config: MonitorConfig) -> str:
    """A tag of these settings' values. An API client that read them sends it back with its
    change, so a change made from settings someone has changed since is refused, not written
    over theirs unseen (a PUT replaces every setting)."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:20]


def webhook_secret(session: Session, study_id: int) -> str | None:
    row = session.get(MonitorSettings, study_id)
    return row.webhook_secret if row is not None else None


def save(session: Session, study: Study, config: MonitorConfig, actor_id: int | None) -> str | None:
    """Store the study's settings; the webhook's signing secret is made when a webhook is first
    set and kept while one is (returned, so the coordinator can configure the receiver)."""
    row = session.get(MonitorSettings, study.id)
    if row is None:
        row = MonitorSettings(study_id=study.id)
        session.add(row)
    row.budget_usd = config.budget_usd
    row.thresholds = config.thresholds.model_dump()
    row.email_to = list(config.email_to)
    row.webhook_url = config.webhook_url
    if config.webhook_url is None:
        row.webhook_secret = None
    elif row.webhook_secret is None:
        row.webhook_secret = secrets.token_hex(32)
    row.updated_at = utcnow()
    row.updated_by_id = actor_id
    audit.record(
        session,
        "monitor.settings",
        "study",
        study.id,
        actor_id,
        budget_usd=config.budget_usd,
        thresholds=row.thresholds,
        email_to=row.email_to,
        webhook=config.webhook_url is not None,
    )
    session.flush()
    return row.webhook_secret
