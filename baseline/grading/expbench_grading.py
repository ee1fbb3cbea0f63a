"""Per-stage grading of EXP-Bench snapshots, stored like a judge grading's sub-scores.

A grading of an EXP-Bench snapshot is a ``Grading`` of kind judge (the study's judge settings)
with one ``LeafGrade`` row per stage, ``leaf_path`` being the stage's name: monitor, design,
implementation, conclusion (the judge, :mod:`scoring.exp_bench_judge`) and execution (the
snapshot's reproduction: ``reproduce_exp_bench.sh``, through the ``reproduce.sh`` the starting
repository carries, exited 0 within the execution limit, EXP-Bench's hour unless the study named
another (:func:`study_execution_limit`); a snapshot whose ``reproduce.sh`` is not that
wrapper scores 0, since its reproduction did not run ``reproduce_exp_bench.sh``; a monitor
violation zeroes it like every stage). Explanations and error analyses are kept on the rows; the
reproduction's failure class is the execution stage's error analysis.

``category_scores["stages"]`` holds each stage's score and ``all_passed`` (the stored
:class:`AllPassedPolicy`), so the analysis table gets ``stage:<name>`` columns as for rubric
gradings. The grading's score, the number the study's curves plot, is ``all_passed``: EXP-Bench's
end-to-end success (1 when every stage passed, execution included), None while undetermined, its
``raw_score`` the same with undetermined counted as not passed. No mean of the stages is made: a
mean that counted the monitor gave a clean monitor a free 0.2 (an empty starting snapshot scored
0.564), and EXP-Bench reports its stages one by one and its conjunctive success, nothing else.

Every model call is a ModelCall row (purpose ``judge_expbench_<stage>``, design and conclusion
sharing ``judge_expbench_design_conclusion``); a stage whose exact
messages were graded before (an unchanged snapshot) reuses that valid row (``cached=True``), so
nothing is paid twice. An invalid stage has no score and leaves the grading incomplete.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from baseline import audit
from baseline.context import Context
from baseline.errors import Conflict, InvalidInput, NotFound
from baseline.grading import claims
from baseline.grading.claims import not_queued
from baseline.grading.grading import (
    RESUMABLE,
    grading_cost,
    judge_call_row,
    keep_paid,
    submission_for,
)
from baseline.grading.reproductions import latest_reproduction
from baseline.models import (
    AgentRun,
    Attempt,
    EgressEvent,
    FileVisibility,
    Grading,
    GradingKind,
    JobStatus,
    LeafGrade,
    Reproduction,
    Snapshot,
    Study,
    Task,
    TaskKind,
    TerminalRecording,
    TranscriptEntry,
    Workspace,
    utcnow,
)
from baseline.tasks.expbench import (
    ANSWER_FILE,
    EXEC_SCRIPT,
    GROUND_TRUTH_FILE,
    ORIGINAL_DIR,
    REPO_DIR,
    REPRODUCE_WRAPPER,
    execution_script_problem,
)
from infra.blobs import BlobStore
from scoring.exp_bench import ExpBenchError, Question, question_from_obj
from scoring.exp_bench_judge import (
    AllPassedPolicy,
    ExpBenchJudge,
    GradingStopped,
    StageResult,
    Submission,
    flagged,
    zeroed,
)
from scoring.llm import CallRecord, ChatClient, JudgeConfig

EXECUTION = "execution"
ClientFactory = Callable[[JudgeConfig], ChatClient]


POLICY_KEY = "expbench_all_passed"  # in Study.judge_config, beside the judge's settings
EXECUTION_LIMIT_KEY = "expbench_execution_limit_s"  # likewise
# EXP-Bench runs reproduce_exp_bench.sh with a one-hour time-out (its judge's ``timeout=3600``).
EXP_BENCH_EXECUTION_LIMIT_S = 3600.0
# What a grading's score (the curves' number) is: EXP-Bench's end-to-end success, never a mean.
HEADLINE = "all_passed"


def is_expbench_grading(grading: Grading) -> bool:
    return "expbench" in (grading.config or {})


def study_policy(study: Study) -> AllPassedPolicy:
    """The study's "all stages passed" rule (the default when none was set)."""
    stored = (study.judge_config or {}).get(POLICY_KEY)
    return AllPassedPolicy() if stored is None else AllPassedPolicy.model_validate(stored)


def set_study_policy(
    session: Session, study: Study, policy: AllPassedPolicy, actor_id: int | None
) -> None:
    """Snapshots are graded under this rule from now on; a snapshot graded under another rule is
    graded again, reusing every stage grade (the rule changes no question the judge is asked)."""
    study.judge_config = {**(study.judge_config or {}), POLICY_KEY: policy.model_dump(mode="json")}
    audit.record(
        session, "study.expbench_policy", "study", study.id, actor_id, **policy.model_dump()
    )


def study_execution_limit(study: Study) -> float:
    """The seconds within which ``reproduce_exp_bench.sh`` must finish for the execution stage
    to pass: EXP-Bench's hour unless the study set another (a named difference)."""
    stored = (study.judge_config or {}).get(EXECUTION_LIMIT_KEY)
    return EXP_BENCH_EXECUTION_LIMIT_S if stored is None else float(stored)


def set_study_execution_limit(
    session: Session, study: Study, seconds: float, actor_id: int | None
) -> None:
    """Snapshots are graded under this execution limit from now on (every judge grade reused)."""
    if not seconds > 0:
        raise InvalidInput(f"the execution limit must be above 0 seconds, got {seconds!r}")
    study.judge_config = {**(study.judge_config or {}), EXECUTION_LIMIT_KEY: float(seconds)}
    audit.record(
        session, "study.expbench_execution_limit", "study", study.id, actor_id, seconds=seconds
    )


def grading_config_hash(
    config: JudgeConfig, policy: AllPassedPolicy, execution_limit_s: float
) -> str:
    """What tells gradings made the same way apart: the judge's settings and the rules."""
    text = json.dumps(
        [config.config_hash(), policy.model_dump(mode="json"), execution_limit_s], sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()


def create_expbench_grading(
    session: Session,
    snapshot: Snapshot,
    config: JudgeConfig,
    *,
    policy: AllPassedPolicy | None = None,
    reproduction: Reproduction | None = None,
    execution_limit_s: float | None = None,
) -> Grading:
    """A queued per-stage grading of an EXP-Bench snapshot (the execution limit: the study's
    when not given)."""
    attempt = session.get(Attempt, snapshot.attempt_id)
    assert attempt is not None
    if attempt.task.kind is not TaskKind.EXPBENCH:
        raise InvalidInput(f"task {attempt.task.slug!r} is not an EXP-Bench task")
    if reproduction is not None and reproduction.snapshot_id != snapshot.id:
        raise InvalidInput(f"reproduction {reproduction.id} is not of snapshot {snapshot.id}")
    policy = policy or AllPassedPolicy()
    if execution_limit_s is None:
        execution_limit_s = study_execution_limit(attempt.study)
    grading = Grading(
        snapshot_id=snapshot.id,
        reproduction_id=None if reproduction is None else reproduction.id,
        kind=GradingKind.JUDGE,
        status=JobStatus.QUEUED,
        config={
            "judge": config.model_dump(mode="json"),
            "code_dev": False,
            "expbench": {
                "all_passed": policy.model_dump(mode="json"),
                "execution_limit_s": execution_limit_s,
            },
        },
        config_hash=grading_config_hash(config, policy, execution_limit_s),
    )
    session.add(grading)
    session.flush()
    return grading


def is_git_internal(path: str) -> bool:
    """A file of the submission's own git repository: neither a change nor a file to monitor."""
    return path == ".git" or path.startswith(".git/")


def rescore_expbench(session: Session, study: Study, config: JudgeConfig) -> list[int]:
    """Queue a grading with `config` of every snapshot of the study's EXP-Bench attempts that
    has a succeeded reproduction (the execution stage is measured on it), under the study's
    rules; earlier gradings are kept. Snapshots not yet reproduced are graded once they are."""
    created: list[int] = []
    policy, limit = study_policy(study), study_execution_limit(study)
    attempts = session.scalars(select(Attempt).where(Attempt.study_id == study.id))
    for attempt in attempts:
        if attempt.task.kind is not TaskKind.EXPBENCH:
            continue
        for snapshot in attempt.snapshots:
            reproduction = latest_reproduction(session, snapshot.id)
            if reproduction is None or reproduction.status is not JobStatus.SUCCEEDED:
                continue
            grading = create_expbench_grading(
                session,
                snapshot,
                config,
                policy=policy,
                reproduction=reproduction,
                execution_limit_s=limit,
            )
            created.append(grading.id)
    return created


def _task_bytes(store: BlobStore, task: Task, visibility: FileVisibility) -> dict[str, bytes]:
    return {f.path: store.get_bytes(f.sha256) for f in task.files if f.visibility is visibility}


def _under(files: dict[str, bytes], prefix: str) -> dict[str, bytes]:
    return {p[len(prefix) + 1 :]: data for p, data in files.items() if p.startswith(prefix + "/")}


def _text(data: bytes) -> str | None:
    if b"\0" in data[:8000]:
        return None
    return data.decode("utf-8", errors="replace")


def unified_diff(before: dict[str, bytes], after: dict[str, bytes]) -> str:
    """The changes from the starting repository to the snapshot, file by file."""
    parts: list[str] = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old == new or is_git_internal(path):
            continue
        old_text = "" if old is None else _text(old)
        new_text = "" if new is None else _text(new)
        if old_text is None or new_text is None:
            parts.append(f"Binary file {path} changed\n")
            continue
        parts.append(
            "".join(
                difflib.unified_diff(
                    old_text.splitlines(keepends=True),
                    new_text.splitlines(keepends=True),
                    fromfile="/dev/null" if old is None else f"a/{path}",
                    tofile="/dev/null" if new is None else f"b/{path}",
                )
            )
        )
    return "\n".join(parts)


def task_question(store: BlobStore, task: Task) -> tuple[Question, dict[str, bytes]]:
    """The task's ground-truth question, and its hidden files (originals included)."""
    hidden = _task_bytes(store, task, FileVisibility.HIDDEN)
    raw = hidden.get(GROUND_TRUTH_FILE)
    if raw is None:
        raise InvalidInput(f"task {task.slug!r} has no {GROUND_TRUTH_FILE}: it cannot be graded")
    truth = json.loads(raw)
    try:
        return question_from_obj(truth["question"], int(truth["index"])), hidden
    except ExpBenchError as exc:
        raise InvalidInput(f"task {task.slug!r}: {exc}") from exc


def _execution(
    snapshot_files: dict[str, bytes], reproduction: Reproduction | None, limit_s: float
) -> StageResult:
    """EXP-Bench's check: ``reproduce_exp_bench.sh`` exited 0 within `limit_s` seconds. The
    reproduction runs under the study's own time-out; one that ran longer than `limit_s` fails
    here as EXP-Bench's would have been stopped."""
    if reproduction is None or reproduction.status is not JobStatus.SUCCEEDED:
        why = "no reproduction" if reproduction is None else f"reproduction {reproduction.status}"
        return StageResult(EXECUTION, None, False, error=f"{why}: execution not measured")
    analysis = reproduction.failure_class or ""
    problem = execution_script_problem(snapshot_files)
    if problem is not None:
        return StageResult(EXECUTION, 0.0, True, problem, analysis)
    over = reproduction.duration_s is not None and reproduction.duration_s > limit_s
    passed = reproduction.exit_code == 0 and not reproduction.timed_out and not over
    if reproduction.timed_out:
        how = "timed out"
    elif over:
        how = f"ran {reproduction.duration_s:.0f} s, over the execution limit of {limit_s:.0f} s"
    else:
        how = f"exited {reproduction.exit_code}"
    return StageResult(
        EXECUTION,
        1.0 if passed else 0.0,
        True,
        f"{EXEC_SCRIPT} {how} in a fresh workspace (reproduction {reproduction.id})",
        "" if passed else analysis or ("over the time limit" if over else ""),
        details={
            "reproduction_id": reproduction.id,
            "failure_class": reproduction.failure_class,
            "limit_s": limit_s,
        },
    )


MAX_ACTIVITY_LINES = 2_000


def history_commands(content: bytes, until: datetime) -> list[str]:
    """The commands of a recorded shell history run up to `until`: bash writes each command's
    time as a ``#<epoch>`` line before it (the workspace sets ``HISTTIMEFORMAT``); a command
    without one is kept."""
    commands: list[str] = []
    at: float | None = None
    for line in content.decode("utf-8", errors="replace").splitlines():
        if line.startswith("#") and line[1:].isdigit():
            at = float(line[1:])
        elif line.strip() and (at is None or at <= until.timestamp()):
            commands.append(line)
    return commands


def activity(session: Session, attempt: Attempt, until: datetime) -> str:
    """What the monitor reads of the participant's process up to the snapshot, the same for
    every kind of participant: the workspace's outbound requests (a paper's PDF fetched shows
    here), a built-in agent's tool calls, an API agent's workspace commands, and a human's shell
    history (git commands show in the last three)."""
    lines: list[str] = []
    requests = session.execute(
        select(EgressEvent.method, EgressEvent.url, EgressEvent.allowed)
        .join(Workspace, Workspace.id == EgressEvent.workspace_id)
        .where(Workspace.attempt_id == attempt.id, EgressEvent.at <= until)
        .order_by(EgressEvent.id)
        .limit(MAX_ACTIVITY_LINES)
    )
    for method, url, allowed in requests:
        lines.append(f"request {'allowed' if allowed else 'refused'}: {method} {url}")
    entries = session.execute(
        select(
            TranscriptEntry.kind,
            TranscriptEntry.tool_calls,
            TranscriptEntry.tool_name,
            TranscriptEntry.content,
        )
        .join(AgentRun, AgentRun.id == TranscriptEntry.run_id)
        .where(
            AgentRun.attempt_id == attempt.id,
            TranscriptEntry.started_at <= until,
            (TranscriptEntry.tool_calls.is_not(None)) | (TranscriptEntry.kind == "tool_start"),
        )
        .order_by(TranscriptEntry.id)
        .limit(MAX_ACTIVITY_LINES)
    )
    for kind, tool_calls, tool_name, content in entries:
        if kind == "tool_start" and not tool_calls:  # an API agent's call (runs.workspace_api)
            lines.append(f"agent command: {tool_name} {content}")
        for call in tool_calls or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            lines.append(f"agent tool call: {function.get('name')} {function.get('arguments')}")
    histories = session.scalars(
        select(TerminalRecording.content)
        .where(TerminalRecording.attempt_id == attempt.id, TerminalRecording.kind == "history")
        .order_by(TerminalRecording.id)
    )
    for content in histories:
        commands = history_commands(content, until)[:MAX_ACTIVITY_LINES]
        lines += [f"shell command: {command}" for command in commands]
    return "\n".join(lines)


def _cache_lookup(session: Session) -> Callable[[str], StageResult | None]:
    def lookup(key: str) -> StageResult | None:
        row = session.scalar(
            select(LeafGrade)
            .where(
                LeafGrade.cache_key == key,
                LeafGrade.valid.is_(True),
                LeafGrade.score.is_not(None),
            )
            .order_by(LeafGrade.id)
            .limit(1)
        )
        if row is None:
            return None
        return StageResult(
            stage=row.leaf_path,
            score=row.score,
            valid=True,
            explanation=row.explanation,
            error_analysis=str(row.details.get("error_analysis", "")),
            cache_key=key,
            details={k: v for k, v in row.details.items() if k != "error_analysis"},
        )

    return lookup


@dataclass
class StageOutcome:
    grading_id: int
    status: JobStatus
    score: float | None
    stages: dict[str, float | None]
    all_passed: float | None
    model_calls: int
    cached: int


def run_expbench_grading(
    ctx: Context,
    grading_id: int,
    *,
    client_factory: ClientFactory = ChatClient,
    store: BlobStore | None = None,
) -> StageOutcome:
    """Grade (or re-grade) every stage of the grading's snapshot; valid grades of unchanged
    questions are reused, so a resumed grading pays only for what was invalid.

    A run given up by its heartbeat (`claims.Heartbeat`) asks the judge for no more calls: the
    judge stops before its next one (`GradingStopped`, which no stage takes for its own failure;
    the judge's stages catch every other exception, so the run went on paying for every stage).
    The calls paid for are kept where the database takes them, no stage is stored, and
    `claims.ClaimLost` is raised, the row left to recovery."""
    store = store or BlobStore(ctx.settings.blob_dir)
    with ctx.session() as session:
        grading = session.get(Grading, grading_id)
        if grading is None or not is_expbench_grading(grading):
            raise NotFound(f"no EXP-Bench grading {grading_id}")
        if grading.status is JobStatus.RUNNING:
            raise not_queued(grading)
        if grading.status is JobStatus.SUCCEEDED:
            raise Conflict(f"grading {grading_id} is {grading.status.value}: nothing to run")
        snapshot = grading.snapshot
        attempt = session.get(Attempt, snapshot.attempt_id)
        assert attempt is not None
        question, hidden = task_question(store, attempt.task)
        config = JudgeConfig.model_validate(grading.config["judge"])
        policy = AllPassedPolicy.model_validate(grading.config["expbench"]["all_passed"])
        reproduction = (
            session.get(Reproduction, grading.reproduction_id)
            if grading.reproduction_id is not None
            else latest_reproduction(session, snapshot.id)
        )
        files = dict(submission_for(store, snapshot, None).files)
        log = submission_for(store, snapshot, reproduction).reproduction if reproduction else None
        starting = _under(_task_bytes(store, attempt.task, FileVisibility.PARTICIPANT), REPO_DIR)
        starting["reproduce.sh"] = REPRODUCE_WRAPPER.encode()  # the seed writes it
        originals = {
            path: _text(data) or "(binary file)"
            for path, data in _under(hidden, ORIGINAL_DIR).items()
        }
        submission = Submission(
            answer=(_text(files[ANSWER_FILE]) or "") if ANSWER_FILE in files else "",
            diff=unified_diff(starting, {p: d for p, d in files.items() if p != ANSWER_FILE}),
            files=tuple(sorted(p for p in files if not is_git_internal(p))),
            originals=originals,
            log=log.log if log is not None else "",
            activity=activity(session, attempt, snapshot.taken_at),
        )
        limit = float(
            grading.config["expbench"].get("execution_limit_s", EXP_BENCH_EXECUTION_LIMIT_S)
        )
        execution = _execution(files, reproduction, limit)
        study_id, attempt_id = attempt.study_id, attempt.id
    claim = claims.claim(ctx, Grading, grading_id, start_from=RESUMABLE, error=None)

    calls = 0

    with claims.Heartbeat(ctx, Grading, grading_id, claim) as heartbeat, ctx.session() as session:

        def on_call(call: CallRecord, stage: str) -> None:
            nonlocal calls
            calls += 1
            session.add(judge_call_row(call, study_id, attempt_id, grading_id))

        client = client_factory(config)
        try:
            judge = ExpBenchJudge(config, client, should_stop=heartbeat.lost.is_set)
            results = judge.grade(
                question, submission, cached=_cache_lookup(session), on_call=on_call
            )
        except GradingStopped:
            keep_paid(session, grading_id, "model calls")
            heartbeat.check()  # stopped only once given up: raises ClaimLost
            raise
        except Exception as exc:
            session.rollback()
            with ctx.session() as failed:
                row = claims.claimed(failed, Grading, grading_id, claim)
                if row is not None:
                    row.status = JobStatus.FAILED
                    row.error = f"{type(exc).__name__}: {exc}"[:2000]
                    row.finished_at = utcnow()
            raise
        finally:
            client.close()
        results.append(zeroed(EXECUTION, results[0]) if flagged(results[0]) else execution)
        session.commit()  # the model calls are paid, whatever becomes of the claim
        if claims.claimed(session, Grading, grading_id, claim) is None:
            raise claims.NotQueued(
                f"grading {grading_id}: this runner's claim was taken over; its stages are not "
                "recorded"
            )
        return _store(session, grading_id, results, policy, calls)


def _store(
    session: Session,
    grading_id: int,
    results: list[StageResult],
    policy: AllPassedPolicy,
    calls: int,
) -> StageOutcome:
    existing = {
        row.leaf_path: row
        for row in session.scalars(select(LeafGrade).where(LeafGrade.grading_id == grading_id))
    }
    for result in results:
        row = existing.get(result.stage)
        if row is None:
            row = LeafGrade(grading_id=grading_id, leaf_path=result.stage)
            session.add(row)
        row.leaf_id = result.stage
        row.score = result.score
        row.valid = result.valid
        row.explanation = result.explanation
        row.error = result.error
        row.cache_key = result.cache_key
        row.cached = result.cached
        row.details = {**result.details, "error_analysis": result.error_analysis}
    scores = {r.stage: (r.score if r.valid else None) for r in results}
    all_passed = policy.evaluate(scores)
    missing = [r.stage for r in results if not r.valid or r.score is None]
    grading = session.get(Grading, grading_id)
    assert grading is not None
    grading.leaves_total = len(results)
    grading.leaves_graded = sum(1 for r in results if r.valid)
    grading.leaves_invalid = sum(1 for r in results if not r.valid)
    grading.status = JobStatus.INCOMPLETE if missing else JobStatus.SUCCEEDED
    grading.score = all_passed
    grading.raw_score = 0.0 if all_passed is None else all_passed  # undetermined counts as not
    grading.category_scores = {
        "score": all_passed,
        "headline": HEADLINE,
        "stages": {
            **{
                r.stage: {
                    "score": scores[r.stage],
                    "explanation": r.explanation,
                    "error_analysis": r.error_analysis,
                }
                for r in results
            },
            "all_passed": {"score": all_passed, "policy": policy.model_dump(mode="json")},
        },
    }
    grading.error = f"stages without a grade: {', '.join(missing)}" if missing else None
    session.flush()
    grading.cost_usd = grading_cost(session, grading_id)
    grading.finished_at = utcnow()
    return StageOutcome(
        grading_id=grading_id,
        status=grading.status,
        score=all_passed,
        stages=scores,
        all_passed=all_passed,
        model_calls=calls,
        cached=sum(1 for r in results if r.cached),
    )
