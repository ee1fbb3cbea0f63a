"""JupyterHub's own record of each workspace server's last activity, for the study monitor.

A person who works only in a JupyterLab terminal leaves no row in Baseline (no model call, no
egress, no resume), so the board's "last activity" would stop at their last resume. The hub
records their activity (the single-user server reports terminal input and kernel messages to it).
The monitor's evaluation job (`baseline.monitor.alerts.evaluate_job`, every 30 s) reads every
server's activity from the hub in one listing (`refresh`) and keeps it in a file of the home,
which every process that shows a board (the portal, the API, `baseline study watch`) reads
(`load`): a board never calls the hub, however many rows or requests there are.

When the hub did not answer, or the job has not read it lately, a reading says so (`unknown`)
instead of passing off Baseline's own records as the person's whole activity.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ValidationError
from sqlalchemy import select

from baseline.config import ConfigError, Settings
from baseline.context import Context
from baseline.hub_settings import hub_config
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    Attempt,
    HubLoginToken,
    Participant,
    ParticipantKind,
    utcnow,
)
from infra.hub import hub_api
from infra.hub.names import hub_username, server_name

log = logging.getLogger(__name__)

FILE = Path("monitor") / "hub-activity.json"
# A reading older than this is stale: the evaluation job (every 30 s) has not run since.
STALE_AFTER = timedelta(seconds=90)


class HubActivity(BaseModel):
    """One reading of the hub: when it was tried, what went wrong, and each server's activity
    (keyed ``hub user/server name``; a server the hub does not list has no activity there)."""

    tried_at: datetime
    error: str | None = None
    servers: dict[str, datetime | None] = {}

    def unknown(self, now: datetime) -> str | None:
        """Why this reading cannot be trusted at `now` (None: it can)."""
        when = self.tried_at.isoformat(timespec="seconds")
        if self.error is not None:
            return f"JupyterHub did not answer at {when}: {self.error}"
        if now - self.tried_at > STALE_AFTER:
            return f"JupyterHub last read at {when}: the monitor's evaluation job has not run since"
        return None

    def server_activity(self, user_id: int, attempt_id: int) -> datetime | None:
        return self.servers.get(f"{hub_username(user_id)}/{server_name(attempt_id)}")


def _path(settings: Settings) -> Path:
    return settings.home / FILE


def hub_used(ctx: Context) -> bool:
    """Whether a live human attempt has been opened in the hub (else the hub is not asked)."""
    with ctx.session() as session:
        found = session.scalar(
            select(Attempt.id)
            .join(Participant, Participant.id == Attempt.participant_id)
            .join(HubLoginToken, HubLoginToken.attempt_id == Attempt.id)
            .where(
                Participant.kind == ParticipantKind.HUMAN,
                Attempt.status.in_(LIVE_ATTEMPT_STATUSES),
                HubLoginToken.used_at.is_not(None),
            )
            .limit(1)
        )
    return found is not None


def read_hub(settings: Settings, now: datetime | None = None) -> HubActivity:
    """Ask the hub for every server's activity (one paged listing); a failure is recorded."""
    at = now or utcnow()
    try:
        config = hub_config(settings)
        found = hub_api.servers_activity(config.public_url, config.service_token())
    except (hub_api.HubUnreachable, ConfigError, OSError) as exc:
        return HubActivity(tried_at=at, error=str(exc))
    return HubActivity(
        tried_at=at, servers={f"{user}/{server}": when for (user, server), when in found.items()}
    )


def save(settings: Settings, reading: HubActivity) -> None:
    """Write the reading whole (a reader never sees half of it)."""
    path = _path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(reading.model_dump_json())
    partial.replace(path)


def refresh(ctx: Context, now: datetime | None = None) -> HubActivity | None:
    """Read the hub and keep the reading, when a live human attempt uses the hub; None (and
    nothing asked) when none does."""
    if not hub_used(ctx):
        return None
    reading = read_hub(ctx.settings, now)
    if reading.error is not None:
        log.warning("the monitor could not read JupyterHub's activity: %s", reading.error)
    save(ctx.settings, reading)
    return reading


# The last reading parsed, by file and modification time: a poll of an unchanged file is one
# stat, not a parse.
_parsed: dict[Path, tuple[int, HubActivity | None]] = {}


def load(settings: Settings) -> HubActivity | None:
    """The latest reading the evaluation job kept (None: it has kept none in this home)."""
    path = _path(settings)
    try:
        stamp = path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
    cached = _parsed.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        reading: HubActivity | None = HubActivity.model_validate_json(path.read_bytes())
    except (ValidationError, OSError) as exc:
        log.warning("the hub activity file %s cannot be read: %s", path, exc)
        reading = None
    _parsed[path] = (stamp, reading)
    return reading
