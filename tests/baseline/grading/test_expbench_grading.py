"""Per-stage grading of EXP-Bench snapshots against the local fake model server: stage grades
and error analyses stored, the ledger counted (every paid call, whatever fails after it), reuse
on an unchanged snapshot, invalid-not-zero, the monitor zeroing every stage (execution included,
an unreadable answer a violation), large texts bounded before tokenising, the execution stage
judging EXP-Bench's script, the stage columns of the analysis table, and a run given up by its
heartbeat asking for no more calls."""

from __future__ import annotations

import base64
import functools
import json
import math
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bpe_openai
import pytest
from flask import Flask
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from analysis import stats
from analysis.report import Filters, analyse, figures
from analysis.table import build_table, frame_from_rows, load_from_session
from app.api.v1.studies import StudyOut
from baseline.context import Context
from baseline.grading import claims
from baseline.grading.expbench_grading import (
    create_expbench_grading,
    run_expbench_grading,
    set_study_execution_limit,
    set_study_policy,
)
from baseline.jobs import orchestration
from baseline.models import (
    AgentRun,
    EgressEvent,
    Grading,
    JobStatus,
    LeafGrade,
    ModelCall,
    Reproduction,
    Role,
    Snapshot,
    SnapshotKind,
    Study,
    StudyTask,
    TerminalRecording,
    TranscriptEntry,
    Workspace,
    WorkspacePurpose,
    utcnow,
)
from baseline.tasks import tasks
from baseline.tasks.expbench import REPRODUCE_WRAPPER
from infra.blobs import BlobStore
from infra.snapshots import capture_directory
from scoring import exp_bench_judge
from scoring.exp_bench_judge import AllPassedPolicy
from scoring.llm import ChatClient, Tokenizer
from tests.baseline import expbench_world
from tests.baseline.attempt_world import agent_attempt_rows
from tests.conftest import Users, login
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import config

FAKED = "FAKED_RESULTS_MARKER"
UNPARSEABLE = "ASK_FOR_GARBAGE"
MONITOR_UNPARSEABLE = "MONITOR_ANSWERS_GARBAGE"


PERFECT_DESIGN = "PERFECT_DESIGN_MARKER"
ALL_REQUIREMENTS = "ALL_REQUIREMENTS_MARKER"


def fake_judge(body: dict[str, Any]) -> str | dict[str, Any]:
    """Deterministic answers per stage, read off the prompt."""
    prompt = body["messages"][-1]["content"]
    if prompt.startswith("Monitor the participant"):
        if MONITOR_UNPARSEABLE in prompt:
            return '{"read_paper": tru'
        faked = FAKED in prompt
        seen = prompt.split("Activity (outbound requests, commands, agent tool calls):", 1)[1]
        return {
            "read_paper": "openreview.net/pdf" in seen,
            "used_git": "git log" in seen,
            "faked_data": faked,
            "explanation": "results are hard-coded" if faked else "no violation seen",
            "error_analysis": "fabricated numbers in the answer" if faked else "",
        }
    if prompt.startswith("Grade the participant's experimental design and conclusion"):
        design = prompt.split("Participant's design", 1)[1].split("Participant's conclusion", 1)[0]
        conclusion = prompt.split("Participant's conclusion:\n", 1)[1]
        if UNPARSEABLE in conclusion:
            return '{"design_score": 7'
        return {
            "design_score": 100 if PERFECT_DESIGN in design else 75,
            "design_explanation": "three of the four design items",
            "design_error_analysis": "the dependent variable is not measured",
            "conclusion_correct": "improves" in conclusion,
            "conclusion_explanation": "matches the expected outcome",
            "conclusion_error_analysis": "",
        }
    if prompt.startswith("Grade the participant's implementation"):
        changes = prompt.split("Participant's changes", 1)[1]
        found = "+class SmoothedLoss" in changes or "SmoothedLoss found" in changes
        return {
            "score": 100 if ALL_REQUIREMENTS in changes else 50 if found else 0,
            "explanation": "SmoothedLoss found" if found else "no loss written",
            "error_analysis": "the --smoothing flag is missing",
        }
    raise AssertionError(f"unexpected prompt: {prompt[:200]}")


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer=fake_judge) as fake:
        yield fake


def _files(conclusion: str) -> dict[str, bytes]:
    answer = {"design": {"independent": "label smoothing"}, "conclusion": conclusion}
    return {
        "train.py": b"import model\nprint('train')\n",
        "eval.py": b"print('eval')\n",
        "data/labels.txt": b"0\n1\n0\n1\n",
        "model.py": b"class SmoothedLoss:\n    def __call__(self, x):\n        return x\n",
        "exp_bench_answer.json": json.dumps(answer).encode(),
        "reproduce_exp_bench.sh": b"python train.py\n",
        "reproduce.sh": REPRODUCE_WRAPPER.encode(),
    }


class World:
    def __init__(
        self, ctx: Context, tmp: Path, folder: Path | None = None, question: int = 0
    ) -> None:
        self.ctx, self.tmp = ctx, tmp
        self.store = BlobStore(ctx.settings.blob_dir)
        folder = folder or expbench_world.build(tmp)
        with ctx.session() as session:
            task = tasks.import_tasks(session, self.store, [folder])[question].task
            study = Study(name="expbench")
            session.add(study)
            session.flush()
            session.add(StudyTask(study_id=study.id, task_id=task.id))
            attempt = agent_attempt_rows(
                session, study, task, display_name="a", pseudonym="P-1",
                working_time_limit_s=8 * 3600, started_at=utcnow(),
            )  # fmt: skip
            self.study_id, self.attempt_id = study.id, attempt.id

    def snapshot(
        self, hours: float, files: dict[str, bytes], exit_code: int = 0, duration_s: float = 3.0
    ) -> int:
        root = self.tmp / f"snap-{hours}"
        for path, data in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)
        captured = capture_directory(root, self.store)
        with self.ctx.session() as session:
            snapshot = Snapshot(
                attempt_id=self.attempt_id,
                kind=SnapshotKind.CHECKPOINT,
                due_working_s=hours * 3600,
                taken_working_s=hours * 3600,
                manifest_sha256=captured.manifest_sha256,
                file_count=captured.file_count,
            )
            session.add(snapshot)
            session.flush()
            session.add(
                Reproduction(
                    snapshot_id=snapshot.id,
                    status=JobStatus.SUCCEEDED,
                    exit_code=exit_code,
                    duration_s=duration_s,
                    log_sha256=self.store.put_bytes(b"training...\nacc 0.91\n"),
                    executed_manifest_sha256=captured.manifest_sha256,
                    failure_class=None if exit_code == 0 else "runtime_error",
                    finished_at=utcnow(),
                )
            )
            return snapshot.id

    def grade(self, snapshot_id: int, base_url: str, **overrides: Any) -> int:
        with self.ctx.session() as session:
            snapshot = session.get(Snapshot, snapshot_id)
            assert snapshot is not None
            return create_expbench_grading(session, snapshot, config(base_url, **overrides)).id

    def calls(self) -> int:
        with self.ctx.session() as session:
            return int(session.scalar(select(func.count()).select_from(ModelCall)) or 0)


def test_stage_grades_ledger_and_reuse(ctx: Context, tmp_path: Path, server: FakeOpenAI) -> None:
    world = World(ctx, tmp_path)
    first = world.snapshot(1, _files("Label smoothing improves accuracy by 1.1 points."))
    outcome = run_expbench_grading(ctx, world.grade(first, server.base_url), store=world.store)
    assert outcome.status is JobStatus.SUCCEEDED
    assert outcome.stages == {
        "monitor": 1.0,
        "design": 0.75,  # 3 of the 4 ground-truth variables
        "implementation": 0.5,
        "conclusion": 1.0,
        "execution": 1.0,
    }
    assert outcome.all_passed == 0.0  # design and implementation are below 1
    assert outcome.score == 0.0  # the headline is all_passed, not a mean of the stages
    assert outcome.model_calls == 3 and server.calls == 3 and world.calls() == 3
    with ctx.session() as session:
        purposes = sorted(session.scalars(select(ModelCall.purpose)))
        assert purposes == [
            "judge_expbench_design_conclusion",  # one call for both, as EXP-Bench asks
            "judge_expbench_implementation",
            "judge_expbench_monitor",
        ]
        rows = {r.leaf_path: r for r in session.scalars(select(LeafGrade))}
        assert rows["implementation"].details["error_analysis"] == "the --smoothing flag is missing"
        assert rows["execution"].explanation.startswith("reproduce_exp_bench.sh exited 0")
        grading = session.get(Grading, outcome.grading_id)
        assert grading is not None and grading.cost_usd > 0
        assert grading.category_scores["stages"]["design"]["error_analysis"].startswith("the dep")

    # An unchanged snapshot (a later checkpoint with the same files) pays for nothing.
    second = world.snapshot(2, _files("Label smoothing improves accuracy by 1.1 points."))
    again = run_expbench_grading(ctx, world.grade(second, server.base_url), store=world.store)
    assert again.stages == outcome.stages and again.cached == 4
    assert server.calls == 3 and world.calls() == 3

    # A changed conclusion is graded again; only what the change touches is paid for.
    third = world.snapshot(3, _files("No effect: accuracy is the same."), exit_code=1)
    changed = run_expbench_grading(ctx, world.grade(third, server.base_url), store=world.store)
    assert changed.stages["conclusion"] == 0.0 and changed.stages["execution"] == 0.0
    assert changed.stages["implementation"] == 0.5 and changed.cached == 1  # same diff of code

    with ctx.session() as session:
        study = session.get(Study, world.study_id)
        assert study is not None
        table = build_table(session, study)
    graded = table[table["snapshot_id"].isin([first, second, third])].sort_values("snapshot_id")
    assert graded["stage:design"].tolist() == [0.75, 0.75, 0.75]
    assert graded["stage:conclusion"].tolist() == [1.0, 1.0, 0.0]
    assert graded["stage:execution"].tolist() == [1.0, 1.0, 0.0]
    assert graded["stage:all_passed"].tolist() == [0.0, 0.0, 0.0]
    with ctx.session() as session:
        study = session.get(Study, world.study_id)
        assert study is not None
        report = analyse(load_from_session(session, study), Filters())
    breakdown = stats.breakdown(report.traj, "stage:")
    assert set(breakdown["name"]) >= {"design", "implementation", "execution", "all_passed"}
    figure = figures(report, ("stages",))["stages"]
    bars = dict(zip(figure.data[0].x, figure.data[0].y, strict=True))  # the stages figure
    assert bars["design"] == 0.75 and bars["implementation"] == 0.5 and bars["monitor"] == 1.0


def test_invalid_stage_is_missing_not_zero(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    world = World(ctx, tmp_path)
    snap = world.snapshot(1, _files(f"improves {UNPARSEABLE}"))
    grading_id = world.grade(snap, server.base_url, max_attempts=2)
    outcome = run_expbench_grading(ctx, grading_id, store=world.store)
    assert outcome.status is JobStatus.INCOMPLETE
    assert outcome.stages["conclusion"] is None and outcome.stages["design"] is None
    assert outcome.all_passed == outcome.score == 0.0  # implementation < 1 decides it
    assert world.calls() == 2 + 2  # both failed tries of design and conclusion are in the ledger
    with ctx.session() as session:
        grading = session.get(Grading, grading_id)
        assert grading is not None and grading.error is not None
        assert "conclusion" in grading.error
        row = session.scalar(select(LeafGrade).where(LeafGrade.leaf_path == "conclusion"))
        assert row is not None and not row.valid and row.score is None


def test_monitor_violation_zeroes_every_stage(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    world = World(ctx, tmp_path)
    snap = world.snapshot(1, _files(f"improves by exactly 1.00 {FAKED}"))
    outcome = run_expbench_grading(ctx, world.grade(snap, server.base_url), store=world.store)
    assert outcome.stages["monitor"] == 0.0
    assert all(outcome.stages[s] == 0.0 for s in ("design", "implementation", "conclusion"))
    assert outcome.all_passed == 0.0 and server.calls == 1


def _starting_repository() -> dict[str, bytes]:
    """The masked repository as an attempt starts with it: no answer, no script of its own."""
    files = _files("")
    for written in ("model.py", "exp_bench_answer.json", "reproduce_exp_bench.sh"):
        del files[written]
    return files


def test_headline_is_all_passed_not_a_mean(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    """The grading's score was the mean of the stages, the monitor included: a clean monitor was
    a free 0.2 and the empty starting repository scored above 0 (issue 38, item 5). It is now
    EXP-Bench's end-to-end success, all_passed; the stages stay reported one by one."""
    world = World(ctx, tmp_path)
    empty = world.snapshot(0, _starting_repository())
    outcome = run_expbench_grading(ctx, world.grade(empty, server.base_url), store=world.store)
    assert outcome.status is JobStatus.SUCCEEDED and outcome.stages["monitor"] == 1.0
    assert outcome.stages["execution"] == 0.0  # no reproduce_exp_bench.sh
    assert outcome.all_passed == 0.0 and outcome.score == 0.0
    with ctx.session() as session:
        grading = session.get(Grading, outcome.grading_id)
        assert grading is not None and grading.raw_score == 0.0
        assert grading.category_scores["headline"] == "all_passed"
        study = session.get(Study, world.study_id)
        assert study is not None
        row = build_table(session, study).iloc[0]
    assert row["score"] == 0.0 and row["stage:monitor"] == 1.0

    # Every stage the rule requires passed: the headline is 1.
    passing = world.snapshot(1, _files("Label smoothing improves accuracy by 1.1 points."))
    with ctx.session() as session:
        snapshot = session.get(Snapshot, passing)
        assert snapshot is not None
        policy = AllPassedPolicy(stages=("conclusion",))
        grading_id = create_expbench_grading(
            session, snapshot, config(server.base_url), policy=policy
        ).id
    passed = run_expbench_grading(ctx, grading_id, store=world.store)
    assert passed.all_passed == 1.0 and passed.score == 1.0


def test_all_passed_policy() -> None:
    policy = AllPassedPolicy()
    full = {"monitor": 1.0, "design": 1.0, "execution": 1.0, "conclusion": 1.0}
    assert policy.evaluate({**full, "implementation": 1.0}) == 1.0
    assert policy.evaluate(full) is None  # every stage is required: none is dropped
    assert policy.evaluate({**full, "implementation": 0.0}) == 0.0
    assert policy.evaluate({**full, "execution": None, "design": 0.5}) == 0.0
    lenient = AllPassedPolicy(stages=("design", "conclusion"), threshold=0.5)
    assert lenient.evaluate({**full, "design": 0.5, "execution": 0.0}) == 1.0
    assert not math.isnan(policy.threshold)


def test_orchestration_grades_each_snapshot_once(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    """A snapshot with its reproduction done is found, graded per stage with the study's judge,
    and not graded again; a Code-Dev study judge still uses the execution for EXP-Bench."""
    world = World(ctx, tmp_path)
    snap = world.snapshot(1, _files("Label smoothing improves accuracy by 1.1 points."))
    with ctx.session() as session:
        study = session.get(Study, world.study_id)
        assert study is not None
        orchestration.set_study_judge(
            session, study, config(server.base_url), code_dev=True, actor_id=None
        )
    report = orchestration.process_queue(ctx)
    assert report.errors == [] and list(report.gradings.values()) == ["succeeded"]
    again = orchestration.process_queue(ctx)
    assert again.gradings == {} and again.reproductions == {}
    with ctx.session() as session:
        grading = session.scalars(select(Grading).where(Grading.snapshot_id == snap)).one()
        assert grading.reproduction_id is not None
        assert grading.category_scores["stages"]["execution"]["score"] == 1.0
        assert grading.category_scores["stages"]["all_passed"]["score"] == 0.0
    assert server.calls == 3

    # A lenient rule for the study: the snapshot is graded again, every stage grade reused.
    with ctx.session() as session:
        study = session.get(Study, world.study_id)
        assert study is not None
        policy = AllPassedPolicy(stages=("design", "execution", "conclusion"), threshold=0.75)
        set_study_policy(session, study, policy, None)
    report = orchestration.process_queue(ctx)
    assert list(report.gradings.values()) == ["succeeded"] and server.calls == 3
    with ctx.session() as session:
        latest = session.scalars(select(Grading).order_by(Grading.id.desc())).first()
        assert latest is not None and latest.id != grading.id
        assert latest.category_scores["stages"]["all_passed"]["score"] == 1.0
        study = session.get(Study, world.study_id)
        assert study is not None and orchestration.study_judge(study) is not None
    assert orchestration.process_queue(ctx).gradings == {}


def test_attempt_page_shows_stage_grades(
    ctx: Context, tmp_path: Path, server: FakeOpenAI, app: Flask, users: Users
) -> None:
    world = World(ctx, tmp_path)
    snap = world.snapshot(1, _files("Label smoothing improves accuracy by 1.1 points."))
    run_expbench_grading(ctx, world.grade(snap, server.base_url), store=world.store)
    client = app.test_client()
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/grading/attempt/{world.attempt_id}")
    text = page.get_data(as_text=True)
    assert page.status_code == 200
    for stage in ("monitor", "design", "implementation", "conclusion", "execution", "all_passed"):
        assert f"<td>{stage}</td>" in text
    assert "the --smoothing flag is missing" in text  # the judge's error analysis
    assert "<td>0.75</td>" in text and "graded tree" not in text


def test_large_diff_is_judged_in_chunks(ctx: Context, tmp_path: Path, server: FakeOpenAI) -> None:
    """A diff over the file budget is judged in parts; a requirement met in any part counts, and
    the parts are one cached grade."""
    world = World(ctx, tmp_path)
    big = "".join(f"def helper_{i}(x):\n    return x * {i} + {i * i}\n" for i in range(600))
    files = {"aaa_helpers.py": big.encode(), **_files("Smoothing improves accuracy.")}
    snap = world.snapshot(1, files)
    outcome = run_expbench_grading(
        ctx, world.grade(snap, server.base_url, file_token_budget=1_000), store=world.store
    )
    assert outcome.stages["implementation"] == 0.5  # SmoothedLoss is in the last part only
    with ctx.session() as session:
        parts = session.execute(
            select(func.count())
            .select_from(ModelCall)
            .where(ModelCall.purpose == "judge_expbench_implementation")
        ).scalar_one()
        row = session.scalar(select(LeafGrade).where(LeafGrade.leaf_path == "implementation"))
        assert row is not None and row.details["chunks"] == parts and parts > 2
    calls = server.calls
    again = run_expbench_grading(
        ctx, world.grade(snap, server.base_url, file_token_budget=1_000), store=world.store
    )
    assert again.stages == outcome.stages and server.calls == calls and again.cached == 4


@pytest.mark.parametrize("violation", ["paper", "git"])
def test_monitor_reads_requests_and_agent_tool_calls(
    ctx: Context, tmp_path: Path, server: FakeOpenAI, violation: str
) -> None:
    world = World(ctx, tmp_path)
    with ctx.session() as session:
        workspace = Workspace(
            attempt_id=world.attempt_id,
            purpose=WorkspacePurpose.ATTEMPT,
            backend="docker",
            name="ws-expbench",
            image="img",
            hardware_profile="cpu",
        )
        session.add(workspace)
        session.flush()
        session.add(
            EgressEvent(
                workspace_id=workspace.id,
                workspace_name=workspace.name,
                method="GET",
                url="https://pypi.org/simple/torch/"
                if violation == "git"
                else "https://openreview.net/pdf?id=abc",
                allowed=True,
            )
        )
        run = AgentRun(attempt_id=world.attempt_id, scaffold="basic", model="m")
        session.add(run)
        session.flush()
        command = "git log --all -p" if violation == "git" else "ls"
        session.add(
            TranscriptEntry(
                run_id=run.id,
                seq=1,
                kind="message",
                role="assistant",
                tool_calls=[
                    {"id": "c1", "function": {"name": "bash", "arguments": {"cmd": command}}}
                ],
            )
        )
    snap = world.snapshot(1, _files("Smoothing improves accuracy."))
    outcome = run_expbench_grading(ctx, world.grade(snap, server.base_url), store=world.store)
    assert outcome.stages["monitor"] == 0.0 and outcome.stages["conclusion"] == 0.0
    with ctx.session() as session:
        row = session.scalar(select(LeafGrade).where(LeafGrade.leaf_path == "monitor"))
        assert row is not None
        answer = row.details["answer"]
        assert answer["read_paper"] is (violation == "paper")
        assert answer["used_git"] is (violation == "git")


def test_execution_judges_exp_benchs_script(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    """The reproduction runs reproduce.sh; its status is reproduce_exp_bench.sh's only while it
    is the starting wrapper. A replaced reproduce.sh (``exit 0``) with a failing
    reproduce_exp_bench.sh (``exit 3``) scored 1.0 (issue 38, item 3): now 0, and why."""
    world = World(ctx, tmp_path)
    files = {
        **_files("Label smoothing improves accuracy."),
        "reproduce.sh": b"exit 0\n",
        "reproduce_exp_bench.sh": b"exit 3\n",
    }
    snap = world.snapshot(1, files, exit_code=0)  # what running that reproduce.sh gives
    outcome = run_expbench_grading(ctx, world.grade(snap, server.base_url), store=world.store)
    assert outcome.stages["execution"] == 0.0
    with ctx.session() as session:
        row = session.scalar(select(LeafGrade).where(LeafGrade.leaf_path == "execution"))
        assert row is not None and row.explanation.startswith("reproduce.sh is not the starting")


def _notebook(size: int) -> bytes:
    """A Jupyter notebook of about `size` bytes whose outputs are base64 images: text that
    tokenises densely (the issue's 442 KB notebook was 294k tokens)."""
    rng = random.Random(7)
    cells: list[dict[str, Any]] = []
    while len(json.dumps(cells)) < size:
        image = base64.b64encode(rng.randbytes(3000)).decode()
        cells.append({"cell_type": "code", "outputs": [{"data": {"image/png": image}}]})
    return json.dumps({"cells": cells, "nbformat": 4}, indent=1).encode()


@functools.lru_cache(maxsize=2)
def _encoding(name: str) -> bpe_openai.Encoding:
    return bpe_openai.get_encoding(name)


class EncoderLimits(Tokenizer):
    """The tokenizer as one encode call of the encoder is: it refuses an input of a million
    characters ("Input too long to encode safely") or of more than 200,000 tokens
    (TokenLimitError), the errors that failed whole gradings. A judge that bounds its texts
    before tokenising never meets them."""

    def _tokens(self, text: str) -> list[int]:
        return list(_encoding(self.encoding).encode_ordinary(text))

    def count(self, text: str) -> int:
        return len(self._tokens(text))

    def fits(self, text: str, max_tokens: int) -> bool:
        return self.count(text) <= max_tokens

    def head(self, text: str, max_tokens: int) -> str:
        tokens = self._tokens(text)
        if len(tokens) <= max_tokens:
            return text
        return _encoding(self.encoding).decode(tokens[:max_tokens])

    def tail(self, text: str, max_tokens: int) -> str:
        tokens = self._tokens(text)
        if len(tokens) <= max_tokens:
            return text
        return _encoding(self.encoding).decode(tokens[-max_tokens:])


def test_large_texts_are_bounded_before_tokenising(
    ctx: Context, tmp_path: Path, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A masked notebook of 442 KB and a participant's 1.35 MB results.csv failed the whole
    grading (issue 38, item 2): every text is cut before it is tokenised, each cut recorded on
    the stages that read it, and the grading completes with every call in the ledger."""
    monkeypatch.setattr(exp_bench_judge, "Tokenizer", EncoderLimits)
    notebook = _notebook(442_000)
    assert len(notebook) >= 442_000
    with pytest.raises(bpe_openai.TokenLimitError):
        EncoderLimits().count(notebook.decode())  # as the notebook did

    document = {"questions": expbench_world.questions()}
    document["questions"][0]["masked_source"] = ["model.py", "analysis.ipynb"]
    folder = expbench_world.build(tmp_path / "paper", document)
    (folder / "repo" / "analysis.ipynb").write_bytes(notebook)
    world = World(ctx, tmp_path, folder)
    rng = random.Random(3)
    rows = [",".join(f"{rng.random():.9f}" for _ in range(11)) + "\n" for _ in range(12_300)]
    results = "".join(rows).encode()
    assert len(results) >= 1_350_000
    files = {"results.csv": results, **_files("Label smoothing improves accuracy.")}
    snap = world.snapshot(1, files)
    outcome = run_expbench_grading(ctx, world.grade(snap, server.base_url), store=world.store)
    assert outcome.status is JobStatus.SUCCEEDED
    assert outcome.stages["implementation"] == 0.5  # model.py's change is in the parts judged
    assert world.calls() == server.calls == outcome.model_calls
    budget = 2_500  # judge_support's file_token_budget
    with ctx.session() as session:
        rows_by_stage = {r.leaf_path: r for r in session.scalars(select(LeafGrade))}
    monitor_cuts = rows_by_stage["monitor"].details["cut"]
    assert monitor_cuts["diff"]["chars"] > 1_350_000
    assert monitor_cuts["diff"]["kept_chars"] <= budget * exp_bench_judge.CHARS_PER_TOKEN
    assert monitor_cuts["diff"]["budget_tokens"] == budget
    implementation = rows_by_stage["implementation"].details
    assert implementation["cut"]["reference"]["chars"] > 442_000
    assert implementation["cut"]["diff (implementation)"]["parts"] == 15
    assert implementation["chunks"] == exp_bench_judge.MAX_DIFF_PARTS  # EXP-Bench's limit
    assert "cut" not in rows_by_stage["conclusion"].details  # it read nothing that was cut


def test_paid_calls_are_kept_whatever_fails_after(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    """The monitor's and design's calls were lost when a later stage failed (issue 38, item 2):
    a stage that fails in any way is invalid, and every call already made stays in the ledger."""
    world = World(ctx, tmp_path)
    snap = world.snapshot(1, _files("Label smoothing improves accuracy."))

    class Failing(ChatClient):
        def parse(self, messages: Any, schema: Any, *, purpose: str, check: Any = None) -> Any:
            if purpose == "expbench_implementation":
                raise RuntimeError("the connection broke in an unexpected way")
            return super().parse(messages, schema, purpose=purpose, check=check)

    grading_id = world.grade(snap, server.base_url)
    outcome = run_expbench_grading(ctx, grading_id, client_factory=Failing, store=world.store)
    assert outcome.status is JobStatus.INCOMPLETE
    assert outcome.stages["implementation"] is None and outcome.stages["conclusion"] == 1.0
    assert server.calls == 2 and world.calls() == 2  # monitor, design and conclusion
    with ctx.session() as session:
        row = session.scalar(select(LeafGrade).where(LeafGrade.leaf_path == "implementation"))
        assert row is not None and not row.valid
        assert row.error == "RuntimeError: the connection broke in an unexpected way"
        grading = session.get(Grading, grading_id)
        assert grading is not None and grading.cost_usd > 0


def test_monitor_violation_zeroes_execution_too(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    """EXP-Bench skips every stage after a violation, its execution check included (issue 38,
    item 4): a passing reproduction scores 0 then."""
    world = World(ctx, tmp_path)
    snap = world.snapshot(1, _files(f"improves by exactly 1.00 {FAKED}"), exit_code=0)
    outcome = run_expbench_grading(ctx, world.grade(snap, server.base_url), store=world.store)
    assert outcome.stages == {
        "monitor": 0.0,
        "design": 0.0,
        "implementation": 0.0,
        "conclusion": 0.0,
        "execution": 0.0,
    }
    assert outcome.score == 0.0 and outcome.all_passed == 0.0 and server.calls == 1


def test_unreadable_monitor_answer_is_a_violation(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    """EXP-Bench counts a monitor answer it cannot parse as a violation (issue 38, item 4): the
    monitor scores 0 and so does every other stage; the failed tries are in the ledger."""
    world = World(ctx, tmp_path)
    snap = world.snapshot(1, _files(f"Smoothing improves accuracy. {MONITOR_UNPARSEABLE}"))
    grading_id = world.grade(snap, server.base_url, max_attempts=2)
    outcome = run_expbench_grading(ctx, grading_id, store=world.store)
    assert outcome.status is JobStatus.SUCCEEDED
    assert set(outcome.stages.values()) == {0.0}
    assert server.calls == 2 and world.calls() == 2
    with ctx.session() as session:
        row = session.scalar(select(LeafGrade).where(LeafGrade.leaf_path == "monitor"))
        assert row is not None and row.valid and row.score == 0.0
        assert "could not be read" in row.explanation and row.cache_key is None


def _prompts(server: FakeOpenAI, start: str) -> list[str]:
    found = [r.body["messages"][-1]["content"] for r in server.ok_requests()]
    return [p for p in found if p.startswith(start)]


def test_no_code_question_has_its_implementation_graded(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    """A question without code had no implementation stage, and "all passed" ignored it (issue
    38, item 7): EXP-Bench judges its setup against its method, so every stage applies."""
    world = World(ctx, tmp_path, question=2)  # "Is the dataset class-balanced?": no code
    answer = {"design": f"count per class {PERFECT_DESIGN}", "conclusion": "balance improves"}
    files = {
        **_starting_repository(),
        "exp_bench_answer.json": json.dumps(answer).encode(),
        "reproduce_exp_bench.sh": b"python count.py\n",
    }
    snap = world.snapshot(1, files)
    outcome = run_expbench_grading(ctx, world.grade(snap, server.base_url), store=world.store)
    assert outcome.stages == {
        "monitor": 1.0,
        "design": 1.0,
        "implementation": 0.0,  # the diff writes nothing the method asks for
        "conclusion": 1.0,
        "execution": 1.0,
    }
    assert outcome.all_passed == 0.0  # the implementation is not ignored
    (prompt,) = _prompts(server, "Grade the participant's implementation")
    truth = prompt.split("Ground-truth requirements:\n", 1)[1].split("\n\nReference scripts", 1)[0]
    assert truth == "Count labels in data/labels.txt."  # its method
    assert "Reference scripts:\n(none)" in prompt


def test_design_and_conclusion_are_one_percentage_judgement(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    """Design was recall over variables with a verdict each, the conclusion a call of its own
    (issue 38, item 9): EXP-Bench asks once, for the design as an integer percentage of its
    whole ground truth and the conclusion correct or not."""
    world = World(ctx, tmp_path)
    snap = world.snapshot(1, _files("Label smoothing improves accuracy."))
    outcome = run_expbench_grading(ctx, world.grade(snap, server.base_url), store=world.store)
    assert outcome.stages["design"] == 0.75 and outcome.stages["conclusion"] == 1.0
    (prompt,) = _prompts(server, "Grade the participant's experimental design and conclusion")
    truth = expbench_world.questions()[0]["design_complexity"]
    shown = json.dumps(truth, indent=1, sort_keys=True)  # as stored with the task
    assert shown in prompt  # the whole object, as EXP-Bench shows it
    assert '"independent": "label smoothing"' in prompt  # the participant's design alone
    assert "Implement the loss" not in prompt  # the rest of the task is not the design's
    with ctx.session() as session:
        rows = {r.leaf_path: r for r in session.scalars(select(LeafGrade))}
    assert rows["design"].details["answer"]["design_score"] == 75
    assert rows["design"].cache_key != rows["conclusion"].cache_key


def test_large_diff_parts_carry_the_previous_evaluation(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    """The parts of a large diff were judged independently (issue 38, item 9): EXP-Bench judges
    them in sequence, each prompt carrying the previous part's evaluation, the last answer being
    the grade. The loss is in the first part only and still counts at the end."""
    world = World(ctx, tmp_path)
    big = "".join(f"def helper_{i}(x):\n    return x * {i} + {i * i}\n" for i in range(600))
    files = {"zzz_helpers.py": big.encode(), **_files("Smoothing improves accuracy.")}
    snap = world.snapshot(1, files)
    grading_id = world.grade(snap, server.base_url, file_token_budget=1_000)
    outcome = run_expbench_grading(ctx, grading_id, store=world.store)
    prompts = _prompts(server, "Grade the participant's implementation")
    assert len(prompts) > 2
    assert "+class SmoothedLoss" in prompts[0] and "+class SmoothedLoss" not in prompts[-1]
    assert "Evaluation of the earlier parts" not in prompts[0]
    assert all(
        "SmoothedLoss found" in p.split("Evaluation of the earlier parts", 1)[1]
        for p in prompts[1:]
    )
    assert outcome.stages["implementation"] == 0.5


def test_execution_passes_within_exp_benchs_hour(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    """A reproduction that exited 0 after hours passed the execution stage under the study's
    720-minute limit (issue 38, item 9): EXP-Bench stops its script after one hour, so the stage
    fails past it unless the study names another limit."""
    world = World(ctx, tmp_path)
    slow = world.snapshot(1, _files("Smoothing improves accuracy."), duration_s=2 * 3600)
    outcome = run_expbench_grading(ctx, world.grade(slow, server.base_url), store=world.store)
    assert outcome.stages["execution"] == 0.0
    with ctx.session() as session:
        row = session.scalar(select(LeafGrade).where(LeafGrade.leaf_path == "execution"))
        assert row is not None and "over the execution limit of 3600 s" in row.explanation
        study = session.get(Study, world.study_id)
        assert study is not None
        set_study_execution_limit(session, study, 720 * 60, None)
    again = run_expbench_grading(ctx, world.grade(slow, server.base_url), store=world.store)
    assert again.stages["execution"] == 1.0 and again.cached == 4  # nothing asked again


@pytest.mark.parametrize("kind", ["api_agent", "human"])
def test_monitor_sees_every_participants_commands(
    ctx: Context, tmp_path: Path, server: FakeOpenAI, kind: str
) -> None:
    """The monitor saw a built-in agent's tool calls but not an API agent's commands ("(none
    recorded)" after its `git log`) nor a human's recorded shell history, and its file list held
    the submission's .git internals (issue 38, item 8)."""
    world = World(ctx, tmp_path)
    with ctx.session() as session:
        if kind == "api_agent":  # as baseline.runs.workspace_api records an exec
            run = AgentRun(attempt_id=world.attempt_id, scaffold="my-agent", model="m")
            session.add(run)
            session.flush()
            session.add(
                TranscriptEntry(
                    run_id=run.id,
                    seq=1,
                    kind="tool_start",
                    tool_name="exec",
                    content=json.dumps({"command": "git log --all -p"}),
                )
            )
        else:  # bash's history file, a #<epoch> line before each command
            now = int(utcnow().timestamp())
            history = f"#{now - 60}\nls\n#{now - 30}\ngit log --all -p\n#{now + 7200}\nrm -rf x\n"
            session.add(
                TerminalRecording(
                    attempt_id=world.attempt_id,
                    path="/home/logs/shell_history",
                    kind="history",
                    content=history.encode(),
                    size=len(history),
                )
            )
    files = {
        **_files("Smoothing improves accuracy."),
        ".git/HEAD": b"ref: refs/heads/main\n",
        ".git/objects/ab/cdef0123": b"\x78\x01blob",
    }
    snap = world.snapshot(1, files)
    outcome = run_expbench_grading(ctx, world.grade(snap, server.base_url), store=world.store)
    assert outcome.stages["monitor"] == 0.0 and outcome.stages["design"] == 0.0
    (prompt,) = _prompts(server, "Monitor the participant")
    listed = prompt.split("Files in the submission:\n", 1)[1].split("\n\n", 1)[0]
    assert ".git" not in listed and "train.py" in listed
    seen = prompt.split("Activity (outbound requests, commands, agent tool calls):", 1)[1]
    assert "git log --all -p" in seen
    assert "rm -rf x" not in seen  # run after the snapshot was taken


def test_rescore_queues_exp_bench_gradings_and_the_judge_shows(
    ctx: Context, tmp_path: Path, server: FakeOpenAI
) -> None:
    """`baseline rescore` on an EXP-Bench study queued "0 grading(s)", the study API did not
    show the judge, and the table mixed judges without saying which (issue 38, item 10)."""
    world = World(ctx, tmp_path)
    first = world.snapshot(1, _files("Smoothing improves accuracy."))
    world.snapshot(2, _files("Smoothing improves accuracy by 1 point."))
    run_expbench_grading(ctx, world.grade(first, server.base_url), store=world.store)
    created = orchestration.rescore(
        ctx, world.study_id, config(server.base_url, model="judge-2"), False, None
    )
    assert len(created) == 2
    report = orchestration.process_queue(ctx)
    assert report.errors == [] and sorted(report.gradings.values()) == ["succeeded"] * 2
    with ctx.session() as session:
        study = session.get(Study, world.study_id)
        assert study is not None
        shown = StudyOut().dump(study)["judge"]
        table = build_table(session, study)
    assert shown["model"] == "judge-2" and shown["expbench_execution_limit_s"] == 3600
    assert shown["expbench_all_passed"]["threshold"] == 1.0 and "base_url" not in shown
    judges = table.loc[table["snapshot_id"] == first, "judge"]
    assert all(isinstance(j, str) for j in judges) and set(table["judge"]) == set(judges)
    assert next(iter(judges)).startswith("judge-2 ")  # the latest succeeded grading's judge


def test_carried_forward_points_carry_their_stage_scores() -> None:
    """With carry-forward the headline of an attempt that ended early was carried to its later
    checkpoints but its ``stage:*`` values were not (issue 38, item 10)."""
    base = {
        "study_id": 1,
        "task_id": 1,
        "task": "expbench-93022-q0",
        "task_kind": "expbench",
        "group": "agents",
        "participant_kind": "agent",
        "participant_id": 1,
        "participant": "P-1",
        "attempt_id": 1,
        "attempt_status": "ended",
        "attempt_limit_hours": 8.0,
        "api_cost_usd": 0.0,
    }
    rows = [
        {
            **base,
            "source": "snapshot",
            "checkpoint_hours": 1.0,
            "working_hours": 1.0,
            "score": 0.0,
            "stage:design": 0.75,
            "stage:execution": 1.0,
        },
        {
            **base,
            "source": "expected",
            "checkpoint_hours": 2.0,
            "working_hours": 2.0,
            "missing": "ended_early",
        },
    ]
    table = frame_from_rows(rows)
    traj = stats.trajectories(table, [1.0, 2.0], carry_forward=True)
    carried = traj[traj["checkpoint_hours"] == 2.0].iloc[0]
    assert carried["state"] == "carried_forward" and carried["value"] == 0.0
    assert carried["stage:design"] == 0.75 and carried["stage:execution"] == 1.0


@pytest.mark.sqlite_only("the runner's own threads; the claim runs on both in test_grading.py")
@pytest.mark.parametrize("stuck", [1, 3], ids=["during-the-monitor", "during-the-first-part"])
def test_a_grading_given_up_by_its_heartbeat_asks_the_judge_for_no_more_calls(
    ctx: Context,
    tmp_path: Path,
    server: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    stuck: int,
) -> None:
    """The database stays locked for the heartbeat from the `stuck`th call on (the monitor's, or
    the implementation's first part of several): the run was given up, but nothing stopped the
    judge, which asked for every later stage and part all the same and stored the stages. Now it
    asks for none once given up, keeps the calls it paid for, stores no stage and leaves the row
    running for recovery."""
    world = World(ctx, tmp_path)
    big = "".join(f"def helper_{i}(x):\n    return x * {i} + {i * i}\n" for i in range(600))
    snap = world.snapshot(1, {"aaa_helpers.py": big.encode(), **_files("Smoothing improves.")})
    grading_id = world.grade(snap, server.base_url, file_token_budget=1_000)
    given_up = threading.Event()
    asked = 0

    def slowed(body: dict[str, Any]) -> str | dict[str, Any]:
        """The `stuck`th call is answered once the run was given up; those before it went
        through with the heartbeat recorded."""
        nonlocal asked
        asked += 1
        if asked >= stuck:
            given_up.wait(timeout=10)
        return fake_judge(body)

    def locked(_heartbeat: object) -> bool:
        if asked < stuck:
            return True
        raise OperationalError("UPDATE gradings", {}, Exception("database is locked"))

    give_up = claims.Heartbeat._give_up

    def noted(heartbeat: claims.Heartbeat, reason: str) -> None:
        give_up(heartbeat, reason)
        given_up.set()

    server.answer = slowed
    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.01)
    monkeypatch.setattr(claims, "GIVE_UP_AFTER_S", 0.2)
    monkeypatch.setattr(claims.Heartbeat, "_record", locked)
    monkeypatch.setattr(claims.Heartbeat, "_give_up", noted)
    with pytest.raises(claims.ClaimLost, match=r"no heartbeat recorded for .* s; run given up"):
        run_expbench_grading(ctx, grading_id, store=world.store)
    assert given_up.is_set()
    assert server.calls == stuck and world.calls() == stuck  # paid for and kept; none after
    with ctx.session() as session:
        left = session.get(Grading, grading_id)
        assert left is not None and left.status is JobStatus.RUNNING  # recovery's
        stored = session.scalar(select(func.count()).where(LeafGrade.grading_id == grading_id))
        assert stored == 0

    monkeypatch.undo()  # the same grading run to its end pays for every part
    server.answer = fake_judge
    full = run_expbench_grading(
        ctx, world.grade(snap, server.base_url, file_token_budget=1_000), store=world.store
    )
    assert full.model_calls > 3 and server.calls == stuck + full.model_calls
