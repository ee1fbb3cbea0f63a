"""Orchestration: each snapshot is reproduced, then judged (or scored by script), in background.

Work is found, not pushed: :func:`discover` looks for snapshots that lack their next step and
queues it, so a snapshot taken by any process (the portal's scheduler, the CLI, a crash recovery)
is picked up without a hook in the snapshot code, and a lost queue entry is found again.

- paper task: a Reproduction (unless the study's judge is in Code-Dev mode), then, once the
  reproduction succeeded, a judge Grading with the study's judge configuration;
- scored task: a script Grading;
- EXP-Bench task: a Reproduction (its execution stage), then a per-stage grading with the study's
  judge configuration (:mod:`baseline.grading.expbench_grading`).

A study's judge configuration (``Study.judge_config``) decides what new snapshots are judged with;
re-scoring a study with a new configuration queues new gradings and keeps the earlier ones (they
differ by configuration hash). :func:`process_queue` runs the queued work one job at a time;
:func:`start_worker` adds it to the background scheduler as an interval job. :func:`progress`
says, per snapshot, where an attempt's scoring stands.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from apscheduler.schedulers.base import BaseScheduler
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.attempts.snapshots import store_for
from baseline.context import Context
from baseline.errors import NotFound
from baseline.grading.claims import NotQueued
from baseline.grading.expbench_grading import (
    create_expbench_grading,
    grading_config_hash,
    is_expbench_grading,
    rescore_expbench,
    run_expbench_grading,
    study_execution_limit,
    study_policy,
)
from baseline.grading.grading import (
    JudgeFactory,
    create_judge_grading,
    rescore_study,
    run_judge_grading,
    task_rubric_and_materials,
)
from baseline.grading.reproductions import (
    latest_reproduction,
    queue_reproduction,
    run_reproduction,
)
from baseline.grading.retries import count_failed_try
from baseline.grading.script_scoring import create_script_grading, run_script_grading
from baseline.models import (
    Attempt,
    Grading,
    GradingKind,
    JobStatus,
    Reproduction,
    Snapshot,
    Study,
    StudyStatus,
    TaskKind,
    utcnow,
)
from baseline.studies.studies import check_not_archived
from baseline.workspaces.workspaces import BackendFactory, backend_for_host
from infra.hardware import ProfileConfigError, load_profiles
from scoring.failure import FailureClass
from scoring.judge import Judge
from scoring.llm import JudgeConfig
from scoring.rubric import Rubric

log = logging.getLogger(__name__)

WORKER_JOB_ID = "scoring-queue"
WORKER_EVERY_S = 15.0
SYNTHETIC_SOURCE = "synthetic"


# --- the study's judge --------------------------------------------------------------------------


@dataclass(frozen=True)
class StudyJudge:
    config: JudgeConfig
    code_dev: bool

    def key(self) -> tuple[str, bool]:
        return self.config.config_hash(), self.code_dev


def study_judge(study: Study) -> StudyJudge | None:
    if not study.judge_config or "judge" not in study.judge_config:
        return None
    return StudyJudge(
        config=JudgeConfig.model_validate(study.judge_config["judge"]),
        code_dev=bool(study.judge_config.get("code_dev")),
    )


def set_study_judge(
    session: Session, study: Study, config: JudgeConfig, code_dev: bool, actor_id: int | None
) -> None:
    """New snapshots of the study are judged with this configuration from now on (not an
    archived study's: `studies.check_not_archived`)."""
    check_not_archived(study, "change its judge")
    study.judge_config = {
        **(study.judge_config or {}),  # other settings kept (the EXP-Bench all-passed rule)
        "judge": config.model_dump(mode="json"),
        "code_dev": code_dev,
    }
    audit.record(
        session,
        "study.judge",
        "study",
        study.id,
        actor_id,
        model=config.model,
        base_url=config.base_url,
        code_dev=code_dev,
        config_hash=config.config_hash(),
    )
    session.flush()


def rescore(
    ctx: Context, study_id: int, config: JudgeConfig, code_dev: bool, actor_id: int | None
) -> list[int]:
    """Judge every snapshot of the study again with `config`; earlier gradings are kept.

    The configuration also becomes the study's judge for snapshots still to come.
    """
    with ctx.session() as session:
        study = session.get(Study, study_id)
        if study is None:
            raise NotFound(f"no study {study_id}")
        check_not_archived(study, "judge its snapshots again")
        set_study_judge(session, study, config, code_dev, actor_id)
        expbench = rescore_expbench(session, study, config)  # stages, never Code-Dev
    return rescore_study(ctx, study_id, config, code_dev=code_dev) + expbench


# --- finding work -------------------------------------------------------------------------------


@dataclass
class Discovered:
    reproductions: list[int] = field(default_factory=list)
    judge_gradings: list[int] = field(default_factory=list)
    script_gradings: list[int] = field(default_factory=list)


def _judge_key(grading: Grading) -> tuple[int, str, bool]:
    return grading.snapshot_id, grading.config_hash, bool(grading.config.get("code_dev"))


def discover(ctx: Context, attempt_id: int | None = None) -> Discovered:
    """Queue the next step of every snapshot (of one attempt, or all) that lacks it."""
    store = store_for(ctx)
    found = Discovered()
    with ctx.session() as session:
        query = (
            select(Snapshot)
            .join(Attempt)
            .join(Study, Attempt.study_id == Study.id)
            .where(Study.status != StudyStatus.ARCHIVED)  # a record: nothing more is run for it
            .order_by(Snapshot.id)
        )
        if attempt_id is not None:
            query = query.where(Snapshot.attempt_id == attempt_id)
        snapshots = list(session.scalars(query))
        ids = [s.id for s in snapshots]
        reproduced = set(
            session.scalars(
                select(Reproduction.snapshot_id).where(Reproduction.snapshot_id.in_(ids))
            )
        )
        gradings = list(session.scalars(select(Grading).where(Grading.snapshot_id.in_(ids))))
        judged = {_judge_key(g) for g in gradings if g.kind is GradingKind.JUDGE}
        scripted = {g.snapshot_id for g in gradings if g.kind is GradingKind.SCRIPT}
        rubrics: dict[int, Rubric] = {}
        for snapshot in snapshots:
            if snapshot.source == SYNTHETIC_SOURCE:
                continue  # drawn from a model (analysis.seed): nothing to run or judge
            attempt = snapshot.attempt
            task = attempt.task
            if task.kind is TaskKind.SCORED:
                if snapshot.id not in scripted:
                    found.script_gradings.append(create_script_grading(session, snapshot).id)
                continue
            judge = study_judge(attempt.study)
            # An EXP-Bench task's execution stage is its reproduction: never Code-Dev.
            code_dev = judge is not None and judge.code_dev and task.kind is TaskKind.PAPER
            if not code_dev and snapshot.id not in reproduced:
                found.reproductions.append(queue_reproduction(session, snapshot).id)
                continue
            if judge is None:
                continue
            policy = study_policy(attempt.study)
            made_with = (
                grading_config_hash(judge.config, policy, study_execution_limit(attempt.study))
                if task.kind is TaskKind.EXPBENCH
                else judge.config.config_hash()
            )
            if (snapshot.id, made_with, code_dev) in judged:
                continue
            reproduction = None
            if not code_dev:
                reproduction = latest_reproduction(session, snapshot.id)
                if reproduction is None or reproduction.status is not JobStatus.SUCCEEDED:
                    continue
            if (
                task.kind is TaskKind.EXPBENCH
            ):  # stages, not a rubric (baseline.grading.expbench_grading)
                grading = create_expbench_grading(
                    session, snapshot, judge.config, policy=policy, reproduction=reproduction
                )
                judged.add(_judge_key(grading))
                found.judge_gradings.append(grading.id)
                continue
            if task.id not in rubrics:
                rubrics[task.id] = task_rubric_and_materials(session, store, task)[0]
            grading = create_judge_grading(
                session,
                snapshot,
                judge.config,
                rubrics[task.id],
                code_dev=code_dev,
                reproduction=reproduction,
            )
            judged.add(_judge_key(grading))
            found.judge_gradings.append(grading.id)
    return found


# --- running work -------------------------------------------------------------------------------


@dataclass
class QueueReport:
    reproductions: dict[int, str] = field(default_factory=dict)  # id -> final status
    gradings: dict[int, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    # Jobs another runner claimed since they were listed: theirs, neither run nor a failed try.
    busy: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return f"{len(self.reproductions)} reproduction(s), {len(self.gradings)} grading(s) run" + (
            f", {len(self.errors)} error(s)" if self.errors else ""
        )


def _queued(
    ctx: Context, model: type[Reproduction] | type[Grading], attempt_id: int | None
) -> list[Any]:
    with ctx.session() as session:
        query = (
            select(model)
            .join(Snapshot)
            .join(Attempt, Snapshot.attempt_id == Attempt.id)
            .join(Study, Attempt.study_id == Study.id)
            .where(model.status == JobStatus.QUEUED, Study.status != StudyStatus.ARCHIVED)
        )
        # A run that failed a try waits for its back-off.
        query = query.where(or_(model.retry_at.is_(None), model.retry_at <= utcnow()))
        if attempt_id is not None:
            query = query.where(Snapshot.attempt_id == attempt_id)
        return list(session.scalars(query.order_by(model.id)))


def _needs(ctx: Context, reproduction_ids: list[int]) -> dict[int, str]:
    """What each reproduction's workspace waits for when no host has room: its GPU model where
    its hardware profile (its attempt's) asks for GPUs, else the profile itself.

    The queue stopped at the first reproduction that found no room, so a study on a CPU profile
    got no score while another study's reproductions waited for GPUs its participants held,
    for days maybe. Now a pass goes on past it, and leaves only those that would take the same
    GPU model: one that asks for one GPU must not take, ahead of its turn, the GPU that an
    earlier one asking for two waits to see free with another."""
    with ctx.session() as session:
        rows = session.execute(
            select(Reproduction.id, Attempt.hardware_profile)
            .join(Snapshot, Snapshot.id == Reproduction.snapshot_id)
            .join(Attempt, Attempt.id == Snapshot.attempt_id)
            .where(Reproduction.id.in_(reproduction_ids))
        )
        by_profile = {reproduction_id: profile for reproduction_id, profile in rows}
    try:
        known = load_profiles()
    except ProfileConfigError:  # the placement says what is wrong with the file
        known = {}
    needs = {}
    for reproduction_id, name in by_profile.items():
        config = known.get(name)
        if config is not None and config.gpu_count > 0:
            needs[reproduction_id] = f"gpu {config.gpu_model}"
        else:
            needs[reproduction_id] = f"profile {name}"
    return needs


def process_queue(
    ctx: Context,
    *,
    attempt_id: int | None = None,
    backend_factory: BackendFactory = backend_for_host,
    judge_factory: JudgeFactory = Judge,
) -> QueueReport:
    """Discover work, then run queued reproductions, judge gradings and script gradings (of
    one attempt, when given: not of an archived study, which the queue passes over)."""
    if attempt_id is not None:
        with ctx.session() as session:
            attempt = session.get(Attempt, attempt_id)
            if attempt is None:
                raise NotFound(f"no attempt {attempt_id}")
            check_not_archived(attempt.study, "score its attempts")
    report = QueueReport()
    discover(ctx, attempt_id)
    queued = _queued(ctx, Reproduction, attempt_id)
    needs = _needs(ctx, [reproduction.id for reproduction in queued])
    no_room: set[str] = set()  # what no host had room for in this pass (`_needs`)
    for reproduction in queued:
        if needs.get(reproduction.id) in no_room:
            continue  # it would wait too, or take what an earlier one waits for
        try:
            done = run_reproduction(ctx, reproduction.id, backend_factory=backend_factory)
        except NotQueued as exc:  # another runner claimed it since it was listed: theirs
            log.info("scoring queue: %s", exc)
            report.busy.append(str(exc))
            continue
        except Exception as exc:  # recorded, retried with back-off, then marked failed
            report.errors.append(f"reproduction {reproduction.id}: {type(exc).__name__}: {exc}")
            _failed_try(ctx, Reproduction, reproduction.id, exc)
            continue
        report.reproductions[done.id] = done.status.value
        if done.status is JobStatus.QUEUED and done.retry_at is not None:
            report.errors.append(f"reproduction {done.id}: {done.error}")  # tried again later
        elif done.status is JobStatus.QUEUED:
            report.errors.append(f"reproduction {done.id}: {done.details.get('waiting')}")
            no_room.add(needs.get(done.id, ""))
    discover(ctx, attempt_id)
    for grading in _queued(ctx, Grading, attempt_id):
        try:
            if grading.kind is GradingKind.JUDGE and is_expbench_grading(grading):
                staged = run_expbench_grading(ctx, grading.id)
                report.gradings[grading.id] = staged.status.value
            elif grading.kind is GradingKind.JUDGE:
                outcome = run_judge_grading(ctx, grading.id, judge_factory=judge_factory)
                report.gradings[grading.id] = outcome.status.value
            elif grading.kind is GradingKind.SCRIPT:
                done_grading = run_script_grading(ctx, grading.id, backend_factory=backend_factory)
                report.gradings[grading.id] = done_grading.status.value
        except NotQueued as exc:  # another runner claimed it since it was listed: theirs
            log.info("scoring queue: %s", exc)
            report.busy.append(str(exc))
        except Exception as exc:  # one broken grading must not stop the others; it is recorded
            report.errors.append(f"grading {grading.id}: {type(exc).__name__}: {exc}")
            _failed_try(ctx, Grading, grading.id, exc)
    return report


def _failed_try(
    ctx: Context,
    model: type[Reproduction] | type[Grading],
    row_id: int,
    exc: Exception,
    now: datetime | None = None,
) -> None:
    """Count a failed try of a queued reproduction or grading that raised
    (`baseline.grading.retries`: retried after a back-off, failed after MAX_TRIES)."""
    with ctx.session() as session:
        row: Reproduction | Grading | None = (
            session.get(Reproduction, row_id)
            if model is Reproduction
            else session.get(Grading, row_id)
        )
        if row is None or row.status is not JobStatus.QUEUED:
            return
        count_failed_try(row, f"{type(exc).__name__}: {exc}", now)


_worker_lock = threading.Lock()
_worker_ctx: Context | None = None


def process_queue_once(
    ctx: Context, backend_factory: BackendFactory = backend_for_host
) -> QueueReport | None:
    """`process_queue`, unless another thread of this process runs it now (None then): the
    scheduler's job and the live demo's faster loop never run the same job twice."""
    if not _worker_lock.acquire(blocking=False):
        return None
    try:
        return process_queue(ctx, backend_factory=backend_factory)
    finally:
        _worker_lock.release()


def _scoring_job() -> None:
    if _worker_ctx is None:
        return
    report = process_queue_once(_worker_ctx)
    if report is not None and (report.reproductions or report.gradings or report.errors):
        log.info("scoring queue: %s", report.summary())


def start_worker(scheduler: BaseScheduler, ctx: Context, every_s: float = WORKER_EVERY_S) -> None:
    """Run the scoring queue in the background scheduler every `every_s` seconds."""
    global _worker_ctx
    _worker_ctx = ctx
    scheduler.add_job(
        "baseline.jobs.orchestration:_scoring_job",
        "interval",
        seconds=every_s,
        id=WORKER_JOB_ID,
        replace_existing=True,
        max_instances=1,
    )


# --- progress -----------------------------------------------------------------------------------


@dataclass
class GradingProgress:
    id: int
    kind: str
    status: str
    leaves_graded: int
    leaves_total: int
    score: float | None
    model: str | None
    error: str | None
    floor_reason: str | None
    # EXP-Bench gradings: stage -> {score, explanation, error_analysis} (empty otherwise).
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class SnapshotProgress:
    snapshot: Snapshot
    reproduction: Reproduction | None
    failure_label: str | None
    reproduction_running_s: float | None
    gradings: list[GradingProgress]


def _running_s(reproduction: Reproduction | None, now: datetime) -> float | None:
    if reproduction is None or reproduction.started_at is None:
        return None
    if reproduction.status is JobStatus.RUNNING:
        return (now - reproduction.started_at).total_seconds()
    return reproduction.duration_s


def progress(
    session: Session, attempt_id: int, now: datetime | None = None
) -> list[SnapshotProgress]:
    """Per snapshot of the attempt: reproduction state and time, gradings with leaves graded."""
    now = now or utcnow()
    attempt = session.get(Attempt, attempt_id)
    if attempt is None:
        raise NotFound(f"no attempt {attempt_id}")
    rows = []
    for snapshot in sorted(attempt.snapshots, key=lambda s: (s.taken_working_s, s.id)):
        reproduction = latest_reproduction(session, snapshot.id)
        label = None
        if reproduction is not None and reproduction.failure_class:
            label = FailureClass(reproduction.failure_class).label
        gradings = [
            GradingProgress(
                id=g.id,
                kind=g.kind.value,
                status=g.status.value,
                leaves_graded=g.leaves_graded,
                leaves_total=g.leaves_total,
                score=g.score,
                model=(g.config.get("judge") or {}).get("model"),
                error=g.error,
                floor_reason=g.floor_reason,
                stages=dict((g.category_scores or {}).get("stages") or {})
                if is_expbench_grading(g)
                else {},
            )
            for g in session.scalars(
                select(Grading).where(Grading.snapshot_id == snapshot.id).order_by(Grading.id)
            )
        ]
        rows.append(
            SnapshotProgress(
                snapshot=snapshot,
                reproduction=reproduction,
                failure_label=label,
                reproduction_running_s=_running_s(reproduction, now),
                gradings=gradings,
            )
        )
    return rows
