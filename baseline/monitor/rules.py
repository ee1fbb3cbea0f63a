"""The alert rules: which conditions hold on a study's board, under its thresholds.

A pure function of the board (`baseline.monitor.board`) and the thresholds
(`baseline.monitor.settings`), so a rule fires on exactly what the coordinator sees. Each condition
names its subject (an attempt, a host, the queue, the spend): `baseline.monitor.alerts` opens one
alert per rule and subject while the condition holds and clears it when it no longer does.
"""

from __future__ import annotations

from dataclasses import dataclass

from baseline.models import LIVE_ATTEMPT_STATUSES, AlertRule, AttemptStatus, WorkspaceStatus
from baseline.monitor.board import Board
from baseline.monitor.settings import Thresholds

_LIVE = {s.value for s in LIVE_ATTEMPT_STATUSES}


@dataclass(frozen=True)
class Condition:
    rule: AlertRule
    subject: str
    message: str


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min"


def conditions(board: Board, limits: Thresholds) -> list[Condition]:
    """Every rule's conditions that hold now."""
    found: list[Condition] = []
    for a in board.attempts:
        who = f"attempt {a.id} ({a.participant}, {a.task})"
        live = a.status in _LIVE
        if limits.workspace_dead and live and a.workspace_status == WorkspaceStatus.DEAD.value:
            found.append(
                Condition(
                    AlertRule.WORKSPACE_DEAD,
                    f"attempt:{a.id}",
                    f"{who}: workspace {a.workspace} on {a.host or '?'} is dead, not restarted",
                )
            )
        idle = a.idle_working_s
        if (
            limits.idle_minutes is not None
            and idle is not None
            and idle >= limits.idle_minutes * 60
        ):
            # A person's work in JupyterHub that the hub could not tell: the alert says so.
            unknown = a.hub_activity_unknown
            basis = "" if unknown is None else f" (Baseline's records only: {unknown})"
            found.append(
                Condition(
                    AlertRule.IDLE,
                    f"attempt:{a.id}",
                    f"{who}: no activity for {_minutes(idle)} of working time while the clock "
                    f"runs{basis}",
                )
            )
        if limits.snapshot_late_minutes is not None and a.status == AttemptStatus.RUNNING.value:
            late = [
                m for m in a.missing_checkpoints
                if m.overdue_working_s >= limits.snapshot_late_minutes * 60
            ]  # fmt: skip
            if late:
                hours = ", ".join(f"{m.due_working_s / 3600:g} h" for m in late)
                found.append(
                    Condition(
                        AlertRule.SNAPSHOT_LATE,
                        f"attempt:{a.id}",
                        f"{who}: checkpoint snapshot at {hours} missing, "
                        f"{_minutes(max(m.overdue_working_s for m in late))} overdue",
                    )
                )
    queue = board.queue
    if limits.failure_rate is not None:
        for what, done, failed in (
            ("reproductions", queue.recent_reproductions, queue.failed_reproductions),
            ("gradings", queue.recent_gradings, queue.failed_gradings),
        ):
            if done >= limits.failure_min_count and failed / done > limits.failure_rate:
                found.append(
                    Condition(
                        AlertRule.FAILURE_RATE,
                        what,
                        f"{failed} of the latest {done} {what} failed "
                        f"(above {limits.failure_rate:.0%})",
                    )
                )
    age = queue.oldest_age_s
    if limits.queue_minutes is not None and age is not None and age >= limits.queue_minutes * 60:
        found.append(
            Condition(
                AlertRule.QUEUE_AGE,
                "queue",
                f"the oldest queued reproduction or grading has waited {_minutes(age)}",
            )
        )
    if limits.host_down:
        for host in board.hosts:
            if host.enabled and not host.healthy and host.last_checked_at is not None:
                found.append(
                    Condition(
                        AlertRule.HOST_DOWN,
                        f"host:{host.id}",
                        f"host {host.name} is down: {host.last_error or 'health check failed'}",
                    )
                )
    spend = board.spend
    if (
        limits.spend_share is not None
        and spend.share is not None
        and spend.share >= limits.spend_share
    ):
        found.append(
            Condition(
                AlertRule.SPEND,
                "spend",
                f"spent ${spend.total_usd:.2f} of the ${spend.budget_usd or 0:.2f} budget "
                f"({spend.share:.0%}; judge ${spend.judge_usd:.2f}, "
                f"agents ${spend.agent_usd:.2f})",
            )
        )
    return found
