"""Alerts: opened when a rule's condition starts to hold, cleared when it stops, acknowledged.

`evaluate` compares a study's conditions (`baseline.monitor.rules`) with its open alerts: a new
condition opens one alert (it fires once, however many evaluations see it), an open alert whose
condition is gone is cleared. Each firing and clearing is delivered
(`baseline.monitor.delivery`) after the alert rows are committed, so a slow webhook never holds
the transaction, and the deliveries are recorded in their own.

`evaluate_job` is the scheduler's periodic entry point (`baseline.jobs.scheduler`). It runs in the
scheduler's thread pool as its own job, one instance at a time, never inside the snapshot loop.
Each round first reads JupyterHub's activity once for every study (`hub_activity.refresh`), which
the boards it evaluates, and every board shown until the next round, take as they are.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.context import Context
from baseline.errors import Conflict, NotFound
from baseline.models import Alert, Study, StudyStatus, User, utcnow
from baseline.monitor import board, delivery, hub_activity, rules, settings

log = logging.getLogger(__name__)

EVALUATE_EVERY_S = 30.0


@dataclass
class Evaluation:
    fired: list[int] = field(default_factory=list)
    cleared: list[int] = field(default_factory=list)


def open_alerts(session: Session, study_id: int) -> list[Alert]:
    return list(
        session.scalars(
            select(Alert)
            .where(Alert.study_id == study_id, Alert.cleared_at.is_(None))
            .order_by(Alert.id)
        )
    )


def evaluate(
    session: Session,
    study: Study,
    now: datetime | None = None,
    hub: hub_activity.HubActivity | None = None,
) -> Evaluation:
    """Open an alert for each new condition, clear each alert whose condition is gone."""
    now = now or utcnow()
    limits = settings.load(session, study.id).thresholds
    holding = {
        (c.rule, c.subject): c
        for c in rules.conditions(board.study_board(session, study, now, hub), limits)
    }
    result = Evaluation()
    current = {(a.rule, a.subject): a for a in open_alerts(session, study.id)}
    for key, alert in current.items():
        if key not in holding:
            alert.cleared_at = now
            result.cleared.append(alert.id)
    for key, condition in holding.items():
        if key in current:
            continue
        alert = Alert(
            study_id=study.id,
            rule=condition.rule,
            subject=condition.subject,
            message=condition.message,
            fired_at=now,
        )
        session.add(alert)
        session.flush()
        result.fired.append(alert.id)
    return result


def evaluate_and_deliver(
    ctx: Context,
    study_id: int,
    now: datetime | None = None,
    hub: hub_activity.HubActivity | None = None,
) -> Evaluation:
    """Evaluate one study (committed), then deliver each firing and clearing (recorded)."""
    with ctx.session() as session:
        study = session.get(Study, study_id)
        if study is None:
            raise NotFound(f"no study {study_id}")
        result = evaluate(session, study, now, hub)
    for event, ids in (("fired", result.fired), ("cleared", result.cleared)):
        for alert_id in ids:
            with ctx.session() as session:
                alert = session.get(Alert, alert_id)
                assert alert is not None
                delivery.deliver(session, alert, event)
    return result


def evaluate_job(ctx: Context) -> None:
    """Every active study, each on its own: one study's failure never stops the others."""
    try:
        hub = hub_activity.refresh(ctx)
    except Exception:  # the boards then say the hub's activity is unknown; the rules still run
        log.exception("reading JupyterHub's activity failed")
        hub = None
    with ctx.session() as session:
        ids = list(session.scalars(select(Study.id).where(Study.status == StudyStatus.ACTIVE)))
    for study_id in ids:
        try:
            evaluate_and_deliver(ctx, study_id, hub=hub)
        except Exception:
            log.exception("alert evaluation of study %s failed", study_id)


def acknowledge(session: Session, study_id: int, alert_id: int, user: User) -> Alert:
    """Record who acknowledged an alert (once: a second acknowledgement is a conflict)."""
    alert = session.get(Alert, alert_id)
    if alert is None or alert.study_id != study_id:
        raise NotFound(f"study {study_id} has no alert {alert_id}")
    if alert.acknowledged_at is not None:
        raise Conflict(f"alert {alert_id} was acknowledged already")
    alert.acknowledged_at = utcnow()
    alert.acknowledged_by_id = user.id
    audit.record(session, "alert.acknowledged", "alert", alert.id, user.id, rule=alert.rule.value)
    session.flush()
    return alert
