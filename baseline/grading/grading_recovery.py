"""Gradings and intermediate scores whose runner stopped mid-run: taken over and recovered.

A running grading (judge, script, EXP-Bench) beats a heartbeat on its row (`claims.Heartbeat`).
One silent for `claims.STALE_AFTER_S` lost its process (a killed worker, its machine down):
left as it was, it stayed running for good (a runner refuses a running grading), its score
missing and never retried, and a script grading's scoring workspace held its GPUs. Recovery (at
the scheduler's start, every minute after, beside the reproductions', and in `baseline
workspace reconcile`) destroys its scoring workspace if it placed one (a family's final score
without GPUs places none: its scoring run, container and saved state, is removed) and queues it
again as a failed try of Baseline's own (`retries.count_failed_try`). A judge grading queued
again grades only its leaves without a valid grade, so nothing already paid is paid again.

An intermediate score (`script_scoring.intermediate_score`) is asked by a person or an agent
waiting for its answer, in a process of the portal's: none waits any more once that process
died, so one silent for `claims.STALE_AFTER_S` is not queued again but closed as Baseline's
failure, with no score (`recover_intermediate_scores`): its scoring workspace destroyed (a
family's scoring run, container and saved state, removed), and its attempt's scoring pause
ended, which had frozen the participant's clock for good.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.attempts import attempts
from baseline.context import Context
from baseline.grading import family_environment
from baseline.grading.claims import (
    STALE_AFTER_S,
    UNNAMED_GRACE_S,
    count_interrupted,
    held_names,
    remove_workspace,
    silence,
    stale,
    sweep_disposable,
)
from baseline.models import (
    Grading,
    GradingKind,
    JobStatus,
    Pause,
    PauseReason,
    ScoreLog,
    utcnow,
)
from baseline.workspaces.workspaces import BackendFactory, backend_for_host
from infra.family_run import is_scoring_run

log = logging.getLogger(__name__)


def recover_interrupted(
    ctx: Context,
    *,
    backend_factory: BackendFactory = backend_for_host,
    now: datetime | None = None,
) -> list[int]:
    """Gradings left running by a process that stopped: what each one named is removed (its
    scoring workspace, or a family's scoring run, `_remove_named`) and it is queued again as a
    failed try (after `MAX_TRIES` it fails, shown as missing). Returns their ids.

    A grading whose leftovers cannot be removed now (its host is down) is left as it is, so
    that the next round tries again: once queued, its next run names its own in the config,
    and only the sweep, past its grace, would remove these."""
    now = now or utcnow()
    recovered: list[int] = []
    with ctx.session() as session:
        for row in stale(session, Grading, now):
            if row.kind is GradingKind.EXPERT:  # a person's grading in progress: no runner
                continue
            name = row.config.get("workspace")
            if _remove_named(session, row.snapshot.attempt_id, name, backend_factory):
                count_interrupted(session, row, now)
                recovered.append(row.id)
    return recovered


def recover_intermediate_scores(
    ctx: Context,
    *,
    backend_factory: BackendFactory = backend_for_host,
    now: datetime | None = None,
) -> list[int]:
    """Intermediate scores left running by a process that stopped: each one's scoring workspace
    is destroyed (a family's scoring run removed from its attempt's host: its container, still
    running maybe, and the state saved for it) and it is closed with an error saying it was
    interrupted (no score: missing, never 0); then every scoring pause that no running
    intermediate score holds is ended (an interrupted one's, or one that a process of an older
    Baseline left). Returns their ids.

    Unlike a job's, it is closed even when what it left cannot be removed now (its host is
    down): it is never run again, so its row keeps the name, and the participant's clock does
    not wait for the host. What it left is then removed by the sweep once its host answers (no
    running row holds it): a workspace by `claims.sweep_disposable`, a scoring run by
    `family_environment.sweep_scoring_runs`. Only a pause of reason scoring is
    ended: a coordinator's, or any other, is never ended here."""
    now = now or utcnow()
    recovered: list[int] = []
    with ctx.session() as session:
        for row in stale(session, ScoreLog, now):
            # Its row keeps the name: a workspace not removed now is the sweep's, every round.
            _remove_named(session, row.attempt_id, row.workspace, backend_factory)
            row.status, row.heartbeat_at = JobStatus.FAILED, None
            row.error = (
                f"interrupted: its process stopped (no sign of life {silence(row, now)}); "
                "no score: ask for it again"
            )
            audit.record(
                session,
                "attempt.intermediate_score.recovered",
                "attempt",
                row.attempt_id,
                None,
                score_log=row.id,
                workspace=row.workspace,
            )
            recovered.append(row.id)
    for attempt_id in _unheld_scoring_pauses(ctx, now):
        if attempts.resume_if(ctx, attempt_id, PauseReason.SCORING, None):
            log.warning("attempt %s: its interrupted intermediate score's pause ended", attempt_id)
    return recovered


def _remove_named(
    session: Session, attempt_id: int, name: str | None, backend_factory: BackendFactory
) -> bool:
    """Remove what a silent run of the attempt named before it stood: a family's scoring run
    (`family_environment.remove_scoring_run`: no workspace row holds it) or a workspace
    (`claims.remove_workspace`); False when it cannot be now."""
    if is_scoring_run(name):
        return family_environment.remove_scoring_run(session, attempt_id, name, backend_factory)
    return remove_workspace(session, name, backend_factory)


def _unheld_scoring_pauses(ctx: Context, now: datetime) -> list[int]:
    """The attempts with an open scoring pause that no running intermediate score holds, opened
    over `STALE_AFTER_S` ago. A score's row is running before it pauses the clock and until it
    resumed it, so such a pause is left by a process that died; the margin keeps a pause just
    opened, or just ended, out of the reads' way."""
    cutoff = now - timedelta(seconds=STALE_AFTER_S)
    running = exists().where(
        ScoreLog.attempt_id == Pause.attempt_id, ScoreLog.status == JobStatus.RUNNING
    )
    with ctx.session() as session:
        return list(
            session.scalars(
                select(Pause.attempt_id).where(
                    Pause.reason == PauseReason.SCORING,
                    Pause.ended_at.is_(None),
                    Pause.started_at < cutoff,
                    ~running,
                )
            )
        )


def recover_job(ctx: Context) -> list[int]:
    """The scheduler's periodic entry point (and one of the first things it does when it
    starts), for the intermediate scores too; then the disposable workspaces no job holds any
    more are destroyed (`claims.sweep_disposable`): after the recoveries (the reproductions'
    runs first), so that a workspace they just freed is not destroyed twice."""
    recovered = recover_interrupted(ctx)
    if recovered:
        log.warning("recovered interrupted gradings: %s", recovered)
    scores = recover_intermediate_scores(ctx)
    if scores:
        log.warning("closed interrupted intermediate scores: %s", scores)
    swept = sweep(ctx, backend_for_host)
    if swept:
        log.warning("removed disposable workspaces and scoring runs no job holds: %s", swept)
    return recovered


def sweep(
    ctx: Context,
    backend_factory: BackendFactory = backend_for_host,
    now: datetime | None = None,
) -> list[str]:
    """After the recoveries (the scheduler's job, and `baseline workspace reconcile`), each in a
    transaction of its own: the disposable workspaces no job holds (`claims.sweep_disposable`),
    then the families' scoring runs no running row names once `UNNAMED_GRACE_S` old
    (`family_environment.sweep_scoring_runs`: what a recovery could not remove while its host
    was down); the names removed."""
    now = now or utcnow()
    with ctx.session() as session:
        swept = sweep_disposable(session, backend_factory, now)
    with ctx.session() as session:
        swept += family_environment.sweep_scoring_runs(
            session,
            lambda: held_names(session),
            now - timedelta(seconds=UNNAMED_GRACE_S),
            backend_factory,
        )
    return swept
