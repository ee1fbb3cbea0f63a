"""Scored tasks in the domain: score snapshots with the task's script, and intermediate scores.

A snapshot of a scored task is graded by a Grading of kind *script*: the task's scoring script runs
in a disposable scoring workspace (`scoring.scoring_run`), never in the participant's, with the
protected files copied only there. A scoring that ran but produced no usable score is the
participant's result at the task's floor (`scoring.scoring_run.floor_reason`): the grading
succeeds with the normalised score 0 (raw: the starting score), ``floor_reason`` names the failure
type (process_failed, timed_out, unparseable_output, no_score, no_valid_solution) and ``error``
keeps its message. A scoring that could not run at all (a broken scoring workspace) is
Baseline's failure: the grading goes back to the queue and the worker retries it with back-off
(`baseline.grading.retries`), then marks it failed, and the table shows it missing, never 0.
One that has no room now (no host can take its scoring workspace; for a family's final score,
too few free GPUs on its attempt's host, `family_environment`) goes back to the queue saying so,
no try counted.

A participant may ask for an intermediate score during the attempt (RE-Bench): the submission is
captured as it is now, the clock is paused for the scoring (reason *scoring*: waiting for a score
is not working time), and a ScoreLog row keeps the score with the working time it was asked at.
That row is written as the score is asked and runs while it is scored, with a heartbeat and the
name of its scoring workspace, so that a process dying meanwhile leaves nothing for good: recovery
closes it as interrupted, ends the pause and removes the workspace (`grading_recovery`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.attempts import attempts, clock
from baseline.attempts.snapshots import SourceResolver, resolve_source, store_for
from baseline.context import Context
from baseline.errors import Conflict, InvalidInput, NotFound
from baseline.grading import claims, family_environment
from baseline.grading.claims import not_queued
from baseline.grading.reproductions import NoRoom, disposable_workspace
from baseline.grading.retries import count_failed_try
from baseline.models import (
    LIVE_ATTEMPT_STATUSES,
    Attempt,
    AttemptStatus,
    FileVisibility,
    Grading,
    GradingKind,
    JobStatus,
    PauseReason,
    ScoreLog,
    Snapshot,
    Task,
    TaskFile,
    TaskKind,
    WorkspacePurpose,
    utcnow,
)
from baseline.tasks import task_families
from baseline.workspaces.workspaces import (
    BackendFactory,
    PlacementError,
    backend_for_host,
    has_room_for,
)
from infra.blobs import BlobStore
from infra.snapshots import Limits, Manifest, load_manifest, tar_file
from scoring.scored_task import ScoringSpec
from scoring.scoring_run import ScoringError, ScoringResult, floor_reason, score_in_workspace

log = logging.getLogger(__name__)


def scoring_material(
    session: Session, store: BlobStore, task: Task
) -> tuple[ScoringSpec, dict[str, bytes]]:
    """The scoring spec and the PROTECTED files (script and protected data) of a scored task."""
    if task.kind is not TaskKind.SCORED or not task.scoring:
        raise InvalidInput(f"task {task.slug!r} is not a scored task: it has no scoring script")
    fields = set(ScoringSpec.model_fields)
    spec = ScoringSpec.model_validate({k: v for k, v in task.scoring.items() if k in fields})
    rows = session.scalars(
        select(TaskFile).where(
            TaskFile.task_id == task.id, TaskFile.visibility == FileVisibility.PROTECTED
        )
    )
    files = {row.path: store.get_bytes(row.sha256) for row in rows}
    return spec, files


def create_script_grading(session: Session, snapshot: Snapshot) -> Grading:
    grading = Grading(
        snapshot_id=snapshot.id, kind=GradingKind.SCRIPT, status=JobStatus.QUEUED, config={}
    )
    session.add(grading)
    session.flush()
    return grading


def _score(
    ctx: Context,
    attempt: Attempt,
    spec: ScoringSpec,
    files: dict[str, bytes],
    submission: Manifest,
    store: BlobStore,
    backend_factory: BackendFactory,
    on_named: Callable[[str], None] | None = None,
    heartbeat: claims.Heartbeat | None = None,
) -> ScoringResult:
    """Run the scoring script in a disposable scoring workspace; `on_named` is told its name
    before it is placed. With the run's `heartbeat`, the scoring stops when its run is given up
    (`claims.Heartbeat.guard`)."""
    if attempt.image_digest is None:
        raise Conflict(f"attempt {attempt.id} has no pinned image: it never started")
    with (
        disposable_workspace(
            ctx,
            image=attempt.image_digest,
            hardware_profile=attempt.hardware_profile,
            purpose=WorkspacePurpose.SCORING,
            network="none",
            backend_factory=backend_factory,
            on_named=on_named,
        ) as placed,
        tar_file(store, submission) as tar,
    ):
        backend = placed.backend
        if heartbeat is not None:
            backend = heartbeat.guard(backend, placed.handle)
        return score_in_workspace(backend, placed.handle, spec, files, tar)


def _result_config(
    spec: ScoringSpec, result: ScoringResult | None, in_environment: bool
) -> dict[str, Any]:
    return {
        "scoring": spec.model_dump(mode="json"),
        "result": None if result is None else result.model_dump(mode="json"),
        "scored_in": (
            family_environment.SCORED_IN_ENVIRONMENT
            if in_environment
            else family_environment.SCORED_IN_SNAPSHOT
        ),
    }


def run_script_grading(
    ctx: Context,
    grading_id: int,
    *,
    backend_factory: BackendFactory = backend_for_host,
    store: BlobStore | None = None,
) -> Grading:
    """Score one snapshot with its task's script; the grading ends succeeded or failed.

    The runner claims the queued grading first (`claims.claim`): a grading another runner holds
    raises `claims.NotQueued`, never a second scoring workspace. Its outcome is written only
    under its claim, and the scoring workspace's name is kept in the config before it stands, so
    that recovery (`grading_recovery`) removes it should this process die. A run given up by its
    heartbeat (`claims.Heartbeat`) stops its scoring and raises `claims.ClaimLost`."""
    store = store or store_for(ctx)
    with ctx.session() as session:
        grading = session.get(Grading, grading_id)
        if grading is None or grading.kind is not GradingKind.SCRIPT:
            raise NotFound(f"no script grading {grading_id}")
        if grading.status is not JobStatus.QUEUED:
            raise not_queued(grading)
        attempt = grading.snapshot.attempt
        environment = family_environment.for_grading(session, grading.snapshot)
        if _still_no_room(session, grading, attempt.hardware_profile, environment):
            return grading
        spec, files = scoring_material(session, store, attempt.task)
        score_log = task_families.score_log_material(session, grading.snapshot)
        files.update(score_log)
        submission = load_manifest(store, grading.snapshot.manifest_sha256)
    claim = claims.claim(ctx, Grading, grading_id)

    def named(name: str) -> None:
        with ctx.session() as session:
            row = claims.claimed(session, Grading, grading_id, claim)
            if row is not None:
                row.config = {**row.config, "workspace": name}

    try:
        with claims.Heartbeat(ctx, Grading, grading_id, claim) as heartbeat:
            if environment is not None:  # a family's final score, where the task ran
                # Its saved state, with GPUs held for it by a scoring workspace until it ends;
                # that, or its scoring run when it has none, is named in the config for
                # recovery, as a script scoring's workspace is.
                result = family_environment.score(
                    ctx, environment, spec, score_log, backend_factory, named
                )
                heartbeat.check()
            else:
                result = _score(
                    ctx,
                    attempt,
                    spec,
                    files,
                    submission,
                    store,
                    backend_factory,
                    named,
                    heartbeat,
                )
    except claims.ClaimLost:  # given up: the row is recovery's
        raise
    except NoRoom as exc:
        with ctx.session() as session:
            row = claims.claimed(session, Grading, grading_id, claim)
            if row is not None:
                row.status, row.error, row.started_at = JobStatus.QUEUED, str(exc), None
        return _get(ctx, grading_id)
    except (ScoringError, PlacementError) as exc:
        _failed_try(ctx, grading_id, claim, f"scoring could not run: {exc}")
        return _get(ctx, grading_id)
    except Conflict as exc:
        return _finish(ctx, grading_id, claim, spec, None, f"scoring could not run: {exc}")
    except Exception as exc:  # a crash of Baseline's own: never leave the row running
        log.exception("grading %s: the scoring crashed", grading_id)
        _failed_try(ctx, grading_id, claim, f"{type(exc).__name__}: {exc}")
        return _get(ctx, grading_id)
    return _finish(
        ctx, grading_id, claim, spec, result, None, in_environment=environment is not None
    )


def _still_no_room(
    session: Session,
    grading: Grading,
    hardware_profile: str,
    environment: family_environment.Environment | None,
) -> bool:
    """Whether a grading that waits for room for its scoring still finds none, asked read only.
    Each try, one a pass for as long as the GPUs stay taken, claimed the row, started its
    heartbeat, found no room and queued it again: two writes for every waiting grading on every
    pass. The first try still goes that way and records why it waits. A family's final score
    waits for its own host's GPUs (`family_environment.still_too_few_gpus`)."""
    if environment is not None:
        return family_environment.still_too_few_gpus(session, environment, grading.error)
    waiting = str(NoRoom.for_purpose(WorkspacePurpose.SCORING))
    return grading.error == waiting and not has_room_for(session, hardware_profile)


def _failed_try(ctx: Context, grading_id: int, claim: datetime, error: str) -> None:
    """Baseline's failure, not the participant's: back to the queue with a back-off, and failed
    only after the last try (`baseline.grading.retries`); only under this runner's claim."""
    with ctx.session() as session:
        row = claims.claimed(session, Grading, grading_id, claim)
        if row is not None:
            row.started_at = None
            count_failed_try(row, error)


def _get(ctx: Context, grading_id: int) -> Grading:
    with ctx.session() as session:
        row = session.get(Grading, grading_id)
        assert row is not None
        return row


def _manual_scoring(task: Task) -> bool:
    """A Task Standard family's score() may return None to ask for a person's score."""
    return bool((task.scoring or {}).get("task_standard"))


def _floored(
    spec: ScoringSpec, result: ScoringResult, manual_scoring: bool
) -> tuple[str | None, float | None, float | None]:
    """(floor reason, raw, normalised) of a scoring run: its own score, or the task's floor."""
    reason = floor_reason(result, manual_scoring=manual_scoring)
    if reason is not None:
        return reason, spec.starting_score, 0.0
    return None, result.raw_score, result.normalised_score


def _finish(
    ctx: Context,
    grading_id: int,
    claim: datetime,
    spec: ScoringSpec,
    result: ScoringResult | None,
    error: str | None,
    *,
    in_environment: bool = False,
) -> Grading:
    with ctx.session() as session:
        grading = claims.claimed(session, Grading, grading_id, claim)
        if grading is None:  # taken over: the run that followed writes its own
            return _get(ctx, grading_id)
        workspace = (
            {"workspace": grading.config["workspace"]} if "workspace" in grading.config else {}
        )
        grading.config = {**_result_config(spec, result, in_environment), **workspace}
        reason, raw, normalised = None, None, None
        if result is not None:
            if not result.ok:
                error = f"{result.failure}: {result.message}"
            manual = _manual_scoring(grading.snapshot.attempt.task)
            reason, raw, normalised = _floored(spec, result, manual)
        usable = normalised is not None
        grading.status = JobStatus.SUCCEEDED if usable else JobStatus.FAILED
        grading.error = error
        grading.floor_reason = reason
        grading.raw_score = raw
        grading.score = normalised
        grading.finished_at = utcnow()
        audit.record(
            session, "grading.script", "grading", grading.id, None, error=error, floor=reason
        )
        return grading


def intermediate_score(
    ctx: Context,
    attempt_id: int,
    actor_id: int | None,
    *,
    backend_factory: BackendFactory = backend_for_host,
    resolver: SourceResolver = resolve_source,
    store: BlobStore | None = None,
) -> ScoreLog:
    """Score the attempt's submission as it is now; the clock pauses while it is scored.

    Its ScoreLog row is written first, running, and marked alive while it is scored
    (`claims.Heartbeat`, its creation the claim), the scoring workspace named on it before it
    is placed (a family's scoring run, which has none: `family_environment.remove_scoring_run`):
    should this process die, recovery closes it as interrupted, with no score, ends its scoring
    pause and removes the workspace (`grading_recovery.recover_intermediate_scores`).
    One given up by its heartbeat raises `claims.ClaimLost`, writing no outcome: the row is
    recovery's."""
    store = store or store_for(ctx)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        if attempt is None:
            raise NotFound(f"no attempt {attempt_id}")
        if attempt.status not in LIVE_ATTEMPT_STATUSES:
            raise Conflict(f"attempt {attempt_id} is {attempt.status.value}: it cannot be scored")
        spec, files = scoring_material(session, store, attempt.task)
        spec = spec.for_intermediate()
        manual = _manual_scoring(attempt.task)
        asked_at = utcnow()
        working_s = clock.attempt_working_s(attempt, asked_at)
        source = resolver(session, attempt)
        # An attempt whose clock is already paused (by its coordinator, or waiting for its
        # agent's driver) is scored inside that pause.
        running = attempt.status is AttemptStatus.RUNNING and clock.open_pause(attempt) is None
        environment = family_environment.for_intermediate(session, attempt)
    # A family is scored where the task runs; other tasks from the submission captured now.
    captured = None if environment is not None else source.capture(store, Limits(), None)
    with ctx.session() as session:
        # Before the pause: a scoring pause with no running score is recovery's to end. Its
        # creation (when it was asked) is its claim; alive from now (the capture may be long).
        entry = ScoreLog(
            attempt_id=attempt_id,
            working_s=working_s,
            status=JobStatus.RUNNING,
            created_at=asked_at,
            heartbeat_at=utcnow(),
        )
        session.add(entry)
        session.flush()
        entry_id = entry.id

    def named(name: str) -> None:
        with ctx.session() as session:
            row = claims.claimed(session, ScoreLog, entry_id, asked_at)
            if row is not None:
                row.workspace = name

    try:
        with claims.Heartbeat(ctx, ScoreLog, entry_id, asked_at) as heartbeat:
            if running:
                attempts.pause(
                    ctx, attempt_id, PauseReason.SCORING, actor_id, note="intermediate score"
                )
            try:
                if environment is not None:
                    result: ScoringResult | None = family_environment.score(
                        ctx, environment, spec, {}, backend_factory, named
                    )
                    heartbeat.check()
                else:
                    assert captured is not None
                    result = _score(
                        ctx,
                        attempt,
                        spec,
                        files,
                        captured.manifest,
                        store,
                        backend_factory,
                        named,
                        heartbeat,
                    )
                error = (
                    None if result is None or result.ok else f"{result.failure}: {result.message}"
                )
            except claims.ClaimLost:
                raise
            except (ScoringError, PlacementError, Conflict) as exc:
                result, error = None, f"scoring could not run: {exc}"
            finally:
                if running:  # its own pause only: one a coordinator opened since stays
                    attempts.resume_if(ctx, attempt_id, PauseReason.SCORING, actor_id)
    except claims.ClaimLost:  # given up: the row is recovery's
        raise
    except Exception as exc:  # a crash of Baseline's own: never leave the row running
        log.exception("attempt %s: the intermediate score crashed", attempt_id)
        crash = f"{type(exc).__name__}: {exc}"
        _log_scored(ctx, entry_id, asked_at, actor_id, spec, None, crash, manual)
        raise
    return _log_scored(ctx, entry_id, asked_at, actor_id, spec, result, error, manual)


def _log_scored(
    ctx: Context,
    entry_id: int,
    claim: datetime,
    actor_id: int | None,
    spec: ScoringSpec,
    result: ScoringResult | None,
    error: str | None,
    manual: bool,
) -> ScoreLog:
    """Write the intermediate score's outcome on its row, only while it is still running under
    this runner's `claim` (one recovery closed meanwhile keeps what recovery wrote)."""
    reason, raw, normalised = None, None, None
    if result is not None:
        reason, raw, normalised = _floored(spec, result, manual)
    with ctx.session() as session:
        entry = claims.claimed(session, ScoreLog, entry_id, claim)
        if entry is None:
            row = session.get(ScoreLog, entry_id)
            assert row is not None
            return row
        entry.raw_score, entry.normalised_score = raw, normalised
        entry.floor_reason, entry.error = reason, error
        entry.status = JobStatus.FAILED if normalised is None else JobStatus.SUCCEEDED
        entry.heartbeat_at = None
        audit.record(
            session,
            "attempt.intermediate_score",
            "attempt",
            entry.attempt_id,
            actor_id,
            working_s=entry.working_s,
            normalised=normalised,
            floor=reason,
            error=error,
        )
        return entry


def score_logs(session: Session, attempt_id: int) -> list[ScoreLog]:
    return list(
        session.scalars(
            select(ScoreLog).where(ScoreLog.attempt_id == attempt_id).order_by(ScoreLog.working_s)
        )
    )


def snapshot_of(session: Session, snapshot_id: int) -> Snapshot:
    snapshot = session.get(Snapshot, snapshot_id)
    if snapshot is None:
        raise NotFound(f"no snapshot {snapshot_id}")
    return snapshot
