"""Gradings whose runner stopped mid-run: taken over and queued again.

A running grading (judge, script, EXP-Bench) beats a heartbeat on its row (`claims.Heartbeat`).
One silent for `claims.STALE_AFTER_S` lost its process (a killed worker, its machine down):
left as it was, it stayed running for good (a runner refuses a running grading), its score
missing and never retried, and a script grading's scoring workspace held its GPUs. Recovery (at
the scheduler's start, every minute after, beside the reproductions', and in `baseline
workspace reconcile`) destroys its scoring workspace if it placed one and queues it again as a
failed try of Baseline's own (`retries.count_failed_try`). A judge grading queued again grades
only its leaves without a valid grade, so nothing already paid is paid again.
"""

from __future__ import annotations

import logging
from datetime import datetime

from baseline.context import Context
from baseline.grading.claims import stale, sweep_disposable, take_over
from baseline.models import Grading, GradingKind, utcnow
from baseline.workspaces.workspaces import BackendFactory, backend_for_host

log = logging.getLogger(__name__)


def recover_interrupted(
    ctx: Context,
    *,
    backend_factory: BackendFactory = backend_for_host,
    now: datetime | None = None,
) -> list[int]:
    """Gradings left running by a process that stopped: each one's scoring workspace is
    destroyed and it is queued again as a failed try (after `MAX_TRIES` it fails, shown as
    missing). Returns their ids.

    A grading whose workspace cannot be destroyed now (its host is down) is left as it is, so
    that the next round tries again."""
    now = now or utcnow()
    recovered: list[int] = []
    with ctx.session() as session:
        for row in stale(session, Grading, now):
            if row.kind is GradingKind.EXPERT:  # a person's grading in progress: no runner
                continue
            if take_over(session, row, row.config.get("workspace"), backend_factory, now):
                recovered.append(row.id)
    return recovered


def recover_job(ctx: Context) -> list[int]:
    """The scheduler's periodic entry point (and one of the first things it does when it
    starts); then the disposable workspaces no job holds any more are destroyed
    (`claims.sweep_disposable`): after both recoveries (the reproductions' runs first), so that
    a workspace they just freed is not destroyed twice."""
    recovered = recover_interrupted(ctx)
    if recovered:
        log.warning("recovered interrupted gradings: %s", recovered)
    with ctx.session() as session:
        swept = sweep_disposable(session, backend_for_host)
    if swept:
        log.warning("destroyed disposable workspaces no job holds: %s", swept)
    return recovered
