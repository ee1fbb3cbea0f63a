"""Per-stage grading of EXP-Bench snapshots, stored like a judge grading's sub-scores.

A grading of an EXP-Bench snapshot is a ``Grading`` of kind judge (the study's judge settings)
with one ``LeafGrade`` row per stage, ``leaf_path`` being the stage's name: monitor, design,
implementation, conclusion (the judge, :mod:`scoring.exp_bench_judge`) and execution (the
snapshot's reproduction: ``reproduce_exp_bench.sh``, through the ``reproduce.sh`` the starting
repository carries, exited 0 within the limit; a snapshot whose ``reproduce.sh`` is not that
wrapper scores 0, since its reproduction did not run ``reproduce_exp_bench.sh``; a monitor
violation zeroes it like every stage). Explanations and error analyses are kept on the rows; the
reproduction's failure class is the execution stage's error analysis.

``category_scores["stages"]`` holds each stage's score and ``all_passed`` (the stored
:class:`AllPassedPolicy`), so the analysis table gets ``stage:<name>`` columns as for rubric
gradings; the grading's score is the mean of the applicable stages (None while one is missing).

Every model call is a ModelCall row (purpose ``judge_expbench_<stage>``); a stage whose exact
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
from baseline.grading.grading import grading_cost, judge_call_row, submission_for
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
    StageResult,
    Submission,
    flagged,
    zeroed,
)
from scoring.llm import CallRecord, ChatClient, JudgeConfig

EXECUTION = "execution"
ClientFactory = Callable[[JudgeConfig], ChatClient]


POLICY_KEY = "expbench_all_passed"  # in Study.judge_config, beside the judge's settings


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


def grading_config_hash(config: JudgeConfig, policy: AllPassedPolicy) -> str:
    """What tells gradings made the same way apart: the judge's settings and the rule."""
    text = json.dumps([config.config_hash(), policy.model_dump(mode="json")], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def create_expbench_grading(
    session: Session,
    snapshot: Snapshot,
    config: JudgeConfig,
    *,
    policy: AllPassedPolicy | None = None,
    reproduction: Reproduction | None = None,
) -> Grading:
    """A queued per-stage grading of an EXP-Bench snapshot."""
    attempt = session.get(Attempt, snapshot.attempt_id)
    assert attempt is not None
    if attempt.task.kind is not TaskKind.EXPBENCH:
        raise InvalidInput(f"task {attempt.task.slug!r} is not an EXP-Bench task")
    if reproduction is not None and reproduction.snapshot_id != snapshot.id:
        raise InvalidInput(f"reproduction {reproduction.id} is not of snapshot {snapshot.id}")
    policy = policy or AllPassedPolicy()
    grading = Grading(
        snapshot_id=snapshot.id,
        reproduction_id=None if reproduction is None else reproduction.id,
        kind=GradingKind.JUDGE,
        status=JobStatus.QUEUED,
        config={
            "judge": config.model_dump(mode="json"),
            "code_dev": False,
            "expbench": {"all_passed": policy.model_dump(mode="json")},
        },
        config_hash=grading_config_hash(config, policy),
    )
    session.add(grading)
    session.flush()
    return grading


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
        if old == new or path == ".git" or path.startswith(".git/"):
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


def _execution(snapshot_files: dict[str, bytes], reproduction: Reproduction | None) -> StageResult:
    if reproduction is None or reproduction.status is not JobStatus.SUCCEEDED:
        why = "no reproduction" if reproduction is None else f"reproduction {reproduction.status}"
        return StageResult(EXECUTION, None, False, error=f"{why}: execution not measured")
    analysis = reproduction.failure_class or ""
    problem = execution_script_problem(snapshot_files)
    if problem is not None:
        return StageResult(EXECUTION, 0.0, True, problem, analysis)
    passed = reproduction.exit_code == 0 and not reproduction.timed_out
    how = "timed out" if reproduction.timed_out else f"exited {reproduction.exit_code}"
    return StageResult(
        EXECUTION,
        1.0 if passed else 0.0,
        True,
        f"{EXEC_SCRIPT} {how} in a fresh workspace (reproduction {reproduction.id})",
        "" if passed else analysis,
        details={"reproduction_id": reproduction.id, "failure_class": reproduction.failure_class},
    )


MAX_ACTIVITY_LINES = 2_000


def activity(session: Session, attempt: Attempt, until: datetime) -> str:
    """What the monitor reads of the participant's process up to the snapshot: the workspace's
    outbound requests (a paper's PDF fetched shows here) and an agent's tool calls (git commands
    show here). Humans' shell history is not recorded by the platform, so it is not shown."""
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
    calls = session.scalars(
        select(TranscriptEntry.tool_calls)
        .join(AgentRun, AgentRun.id == TranscriptEntry.run_id)
        .where(
            AgentRun.attempt_id == attempt.id,
            TranscriptEntry.started_at <= until,
            TranscriptEntry.tool_calls.is_not(None),
        )
        .order_by(TranscriptEntry.id)
        .limit(MAX_ACTIVITY_LINES)
    )
    for tool_calls in calls:
        for call in tool_calls or []:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            lines.append(f"agent tool call: {function.get('name')} {function.get('arguments')}")
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
    questions are reused, so a resumed grading pays only for what was invalid."""
    store = store or BlobStore(ctx.settings.blob_dir)
    with ctx.session() as session:
        grading = session.get(Grading, grading_id)
        if grading is None or not is_expbench_grading(grading):
            raise NotFound(f"no EXP-Bench grading {grading_id}")
        if grading.status in (JobStatus.RUNNING, JobStatus.SUCCEEDED):
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
            files=tuple(sorted(files)),
            originals=originals,
            log=log.log if log is not None else "",
            activity=activity(session, attempt, snapshot.taken_at),
        )
        execution = _execution(files, reproduction)
        study_id, attempt_id = attempt.study_id, attempt.id
        grading.status = JobStatus.RUNNING
        grading.error = None

    calls = 0

    with ctx.session() as session:

        def on_call(call: CallRecord, stage: str) -> None:
            nonlocal calls
            calls += 1
            session.add(judge_call_row(call, study_id, attempt_id, grading_id))

        client = client_factory(config)
        try:
            results = ExpBenchJudge(config, client).grade(
                question, submission, cached=_cache_lookup(session), on_call=on_call
            )
        except Exception as exc:
            session.rollback()
            with ctx.session() as failed:
                row = failed.get(Grading, grading_id)
                assert row is not None
                row.status, row.error = JobStatus.FAILED, f"{type(exc).__name__}: {exc}"[:2000]
                row.finished_at = utcnow()
            raise
        finally:
            client.close()
        results.append(zeroed(EXECUTION, results[0]) if flagged(results[0]) else execution)
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
    all_passed = policy.evaluate(scores, set(scores))
    missing = [r.stage for r in results if not r.valid or r.score is None]
    mean = None if missing else sum(s for s in scores.values() if s is not None) / len(scores)
    grading = session.get(Grading, grading_id)
    assert grading is not None
    grading.leaves_total = len(results)
    grading.leaves_graded = sum(1 for r in results if r.valid)
    grading.leaves_invalid = sum(1 for r in results if not r.valid)
    grading.status = JobStatus.INCOMPLETE if missing else JobStatus.SUCCEEDED
    grading.score = mean
    grading.raw_score = sum(s or 0.0 for s in scores.values()) / len(scores)
    grading.category_scores = {
        "score": mean,
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
        score=mean,
        stages=scores,
        all_passed=all_passed,
        model_calls=calls,
        cached=sum(1 for r in results if r.cached),
    )
