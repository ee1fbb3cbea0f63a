"""Judge gradings in the database: progress, ledger, cache across gradings, resume, re-score."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from baseline.context import Context
from baseline.errors import Conflict
from baseline.grading import claims, grading_recovery
from baseline.grading import grading as grading_mod
from baseline.grading.expert_grading import export_tree
from baseline.grading.grading import (
    cost_summary,
    create_judge_grading,
    rescore_study,
    run_judge_grading,
    task_rubric_and_materials,
)
from baseline.models import (
    Attempt,
    FileVisibility,
    Grading,
    JobStatus,
    LeafGrade,
    ModelCall,
    Reproduction,
    Snapshot,
    SnapshotKind,
    Study,
    Task,
    TaskFile,
    TaskKind,
    utcnow,
)
from infra.blobs import BlobStore
from infra.snapshots import capture_directory
from scoring.judge import Judge
from scoring.llm import JudgeConfig
from scoring.rubric import TaskCategory
from scoring.rubric_graded import GradedTree
from tests.baseline.attempt_world import agent_attempt_rows
from tests.conftest import shared_path
from tests.fake_openai import FakeOpenAI
from tests.scoring.judge_support import config, materials, scripted_answer, synthetic_files


@dataclass
class World:
    ctx: Context
    store: BlobStore
    study_id: int
    attempt_id: int
    snapshot_id: int
    reproduction_id: int


def _write(root: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _snapshot(
    session: Any,
    store: BlobStore,
    tmp: Path,
    attempt_id: int,
    files: dict[str, bytes],
    hours: float,
) -> tuple[Snapshot, Reproduction]:
    """A snapshot of `files` without outputs, and its reproduction that produced them."""
    before = {
        p: d for p, d in files.items() if not p.startswith("results/") and p != "reproduce.log"
    }
    _write(tmp / f"before-{hours}", before)
    _write(tmp / f"after-{hours}", files)
    captured = capture_directory(tmp / f"before-{hours}", store)
    executed = capture_directory(tmp / f"after-{hours}", store)
    snapshot = Snapshot(
        attempt_id=attempt_id,
        kind=SnapshotKind.CHECKPOINT,
        due_working_s=hours * 3600,
        taken_working_s=hours * 3600,
        manifest_sha256=captured.manifest_sha256,
        file_count=captured.file_count,
    )
    session.add(snapshot)
    session.flush()
    reproduction = Reproduction(
        snapshot_id=snapshot.id,
        status=JobStatus.SUCCEEDED,
        exit_code=0,
        duration_s=12.0,
        log_sha256=store.put_bytes(files["reproduce.log"]),
        executed_manifest_sha256=executed.manifest_sha256,
        finished_at=utcnow(),
    )
    session.add(reproduction)
    session.flush()
    return snapshot, reproduction


@pytest.fixture
def world(ctx: Context, tmp_path: Path) -> World:
    store = BlobStore(ctx.settings.blob_dir)
    rubric = shared_path("paperbench", "papers", "rice", "rubric.json").read_bytes()
    m = materials()
    with ctx.session() as session:
        task = Task(slug="rice", title="RICE", kind=TaskKind.PAPER, content_hash="x" * 64)
        session.add(task)
        session.flush()
        for path, data, visibility in [
            ("rubric.json", rubric, FileVisibility.HIDDEN),
            ("paper.md", m.paper.encode(), FileVisibility.PARTICIPANT),
            ("addendum.md", m.addendum.encode(), FileVisibility.PARTICIPANT),
            ("judge.addendum.md", m.judge_addendum.encode(), FileVisibility.HIDDEN),
        ]:
            session.add(
                TaskFile(
                    task_id=task.id,
                    path=path,
                    sha256=store.put_bytes(data),
                    size=len(data),
                    visibility=visibility,
                )
            )
        study = Study(name="judging")
        session.add(study)
        session.flush()
        attempt = agent_attempt_rows(
            session, study, task, display_name="a", pseudonym="P-1", working_time_limit_s=48 * 3600
        )
        snapshot, reproduction = _snapshot(
            session, store, tmp_path, attempt.id, synthetic_files(), 2
        )
        return World(ctx, store, study.id, attempt.id, snapshot.id, reproduction.id)


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(answer=scripted_answer) as fake:
        yield fake


def _new_grading(world: World, base_url: str, code_dev: bool = False, **overrides: Any) -> int:
    with world.ctx.session() as session:
        task = session.get(Attempt, world.attempt_id).task  # type: ignore[union-attr]
        rubric, _ = task_rubric_and_materials(session, world.store, task)
        snapshot = session.get(Snapshot, world.snapshot_id)
        reproduction = session.get(Reproduction, world.reproduction_id)
        assert snapshot is not None
        grading = create_judge_grading(
            session,
            snapshot,
            config(base_url, **overrides),
            rubric,
            code_dev=code_dev,
            reproduction=reproduction,
        )
        return grading.id


def test_grading_writes_leaves_progress_and_ledger(
    world: World, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grading_mod, "PROGRESS_EVERY_S", 0.0)
    grading_id = _new_grading(world, server.base_url)
    seen: list[tuple[JobStatus, int, int]] = []

    def spying(body: dict[str, Any]) -> dict[str, Any]:
        if len(server.requests) % 25 == 0:  # during the run: what the portal would read
            with world.ctx.session() as session:
                g = session.get(Grading, grading_id)
                assert g is not None
                seen.append((g.status, g.leaves_graded, g.leaves_total))
        return scripted_answer(body)

    server.answer = spying
    outcome = run_judge_grading(world.ctx, grading_id, store=world.store)

    with world.ctx.session() as session:
        errors = session.scalars(
            select(LeafGrade.error).where(LeafGrade.grading_id == grading_id, ~LeafGrade.valid)
        ).all()
    assert outcome.status is JobStatus.SUCCEEDED, errors
    assert outcome.leaves_graded == outcome.leaves_total == 361
    assert all(status is JobStatus.RUNNING for status, _, _ in seen)
    assert any(0 < graded < total == 361 for _, graded, total in seen), seen
    with world.ctx.session() as session:
        g = session.get(Grading, grading_id)
        assert g is not None and g.score is not None and 0 < g.score < 1
        assert g.finished_at is not None and g.error is None
        assert set(g.category_scores["categories"]) == {
            c.value for c in TaskCategory if c is not TaskCategory.SUBTREE
        }
        rows = session.scalars(select(LeafGrade).where(LeafGrade.grading_id == grading_id)).all()
        assert len(rows) == 361 and all(r.valid and r.score in (0.0, 1.0) for r in rows)
        assert all(r.details["expectations"] for r in rows if r.cache_key)
        calls = session.scalar(select(func.count()).select_from(ModelCall))
        assert calls == len(server.requests) == outcome.model_calls
        purposes = set(session.scalars(select(ModelCall.purpose)).all())
        assert purposes == {"judge_grade", "judge_rank"}
        per_grading = cost_summary(session, grading_id=grading_id)
        per_attempt = cost_summary(session, attempt_id=world.attempt_id)
        per_study = cost_summary(session, study_id=world.study_id)
        assert per_grading == per_attempt == per_study
        assert per_grading.calls == calls and per_grading.cost_usd == pytest.approx(g.cost_usd)
        assert per_grading.cost_usd > 0 and per_grading.by_purpose["judge_rank"] > 0


def test_rescoring_keeps_earlier_gradings_and_reuses_unchanged_grades(
    world: World, server: FakeOpenAI
) -> None:
    first = _new_grading(world, server.base_url)
    run_judge_grading(world.ctx, first, store=world.store)
    server.reset()

    new_ids = rescore_study(world.ctx, world.study_id, config(server.base_url), store=world.store)
    assert len(new_ids) == 1 and first not in new_ids
    outcome = run_judge_grading(world.ctx, new_ids[0], store=world.store)
    assert server.requests == [] and outcome.model_calls == 0
    assert outcome.status is JobStatus.SUCCEEDED and outcome.leaves_cached > 300
    with world.ctx.session() as session:
        old, new = session.get(Grading, first), session.get(Grading, new_ids[0])
        assert old is not None and new is not None
        assert old.status is JobStatus.SUCCEEDED and old.score == new.score
        assert new.cost_usd == 0.0


def test_a_new_judge_configuration_grades_again(world: World, server: FakeOpenAI) -> None:
    run_judge_grading(world.ctx, _new_grading(world, server.base_url), store=world.store)
    server.reset()
    ids = rescore_study(
        world.ctx,
        world.study_id,
        config(server.base_url, reasoning_effort="high"),
        store=world.store,
    )
    outcome = run_judge_grading(world.ctx, ids[0], store=world.store)
    assert outcome.model_calls > 300 and outcome.leaves_cached == 0


def test_snapshot_with_one_changed_file_regrades_only_its_leaves(
    world: World, server: FakeOpenAI, tmp_path: Path
) -> None:
    first = _new_grading(world, server.base_url)
    run_judge_grading(world.ctx, first, store=world.store)
    files = synthetic_files()
    files["src/pinn/train.py"] = files["src/pinn/train.py"].replace(b"tanh", b"gelu")
    with world.ctx.session() as session:
        snapshot, reproduction = _snapshot(
            session, world.store, tmp_path, world.attempt_id, files, 8
        )
        world.snapshot_id, world.reproduction_id = snapshot.id, reproduction.id
        rows = session.scalars(select(LeafGrade).where(LeafGrade.grading_id == first)).all()
        selecting = sum(1 for r in rows if "src/pinn/train.py" in r.details["files"])
    server.reset()
    outcome = run_judge_grading(world.ctx, _new_grading(world, server.base_url), store=world.store)
    assert outcome.status is JobStatus.SUCCEEDED
    assert 0 < outcome.model_calls == len(server.requests) == selecting < 361 // 2


def test_incomplete_grading_resumes_only_invalid_leaves(world: World) -> None:
    with FakeOpenAI(answer=scripted_answer, fault_rate=0.4, fault_kinds=("500",), seed=5) as bad:
        grading_id = _new_grading(world, bad.base_url, max_attempts=1)
        outcome = run_judge_grading(world.ctx, grading_id, store=world.store)
    assert outcome.status is JobStatus.INCOMPLETE and outcome.leaves_invalid > 0
    with world.ctx.session() as session:
        g = session.get(Grading, grading_id)
        assert g is not None and g.score is None and "resume" in (g.error or "")
        invalid = session.scalars(
            select(LeafGrade).where(LeafGrade.grading_id == grading_id, LeafGrade.valid.is_(False))
        ).all()
        assert len(invalid) == outcome.leaves_invalid and all(r.error for r in invalid)
        assert all(r.score is None for r in invalid)
        # resume against a healthy endpoint (same stored settings but a new base_url)
    with FakeOpenAI(answer=scripted_answer) as good, world.ctx.session() as session:
        g = session.get(Grading, grading_id)
        assert g is not None
        g.config = {**g.config, "judge": {**g.config["judge"], "base_url": good.base_url}}
        session.commit()
        resumed = run_judge_grading(world.ctx, grading_id, store=world.store)
        grade_calls = [r for r in good.ok_requests() if "# Requirement to grade" in str(r.body)]
    assert resumed.status is JobStatus.SUCCEEDED and resumed.leaves_graded == 361
    assert len(grade_calls) == outcome.leaves_invalid
    with pytest.raises(Conflict, match="complete"):
        run_judge_grading(world.ctx, grading_id, store=world.store)


def test_code_dev_grading_needs_no_reproduction(world: World, server: FakeOpenAI) -> None:
    grading_id = _new_grading(world, server.base_url, code_dev=True)
    outcome = run_judge_grading(world.ctx, grading_id, store=world.store)
    with world.ctx.session() as session:
        g = session.get(Grading, grading_id)
        assert g is not None and g.reproduction_id is None
        rubric, _ = task_rubric_and_materials(session, world.store, g.snapshot.attempt.task)
    expected = sum(
        1 for _, n in rubric.leaves() if n.task_category is TaskCategory.CODE_DEVELOPMENT
    )
    assert outcome.leaves_total == outcome.leaves_graded == expected
    assert not any("# reproduce.log" in str(r.body) for r in server.requests)
    # exported as PaperBench's Code-Dev tree: only those leaves, none null, the root theirs
    with world.ctx.session() as session:
        exported = export_tree(session, world.store, grading_id)
    tree = GradedTree.from_obj(exported)
    assert {n.task_category for _, n in tree.rubric.leaves()} == {TaskCategory.CODE_DEVELOPMENT}
    assert tree.rubric.stats().leaves == len(tree.grades) == expected
    assert exported["score"] == pytest.approx(_weighted_mean(exported))


def _weighted_mean(node: dict[str, Any]) -> float:
    """PaperBench's aggregation, restated: a leaf's score; the weighted mean of the children."""
    if not node["sub_tasks"]:
        return float(node["score"])
    total = sum(child["weight"] for child in node["sub_tasks"])
    if not total:
        return 0.0
    return sum(_weighted_mean(c) * c["weight"] for c in node["sub_tasks"]) / total


def test_a_second_runner_that_read_the_judge_grading_queued_pays_for_no_leaf_again(
    world: World, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's worker and `baseline score` both read the grading queued; the second one
    grades it to its end between the first one's read and its write. The first one then set it
    running again and graded it as well; now it finds it claimed and is told so, and the
    endpoint was asked only for the second runner's calls."""
    grading_id = _new_grading(world, server.base_url)
    submission_for = grading_mod.submission_for
    runners: list[grading_mod.GradingOutcome] = []
    started: list[str] = []

    def second_runner_meanwhile(*args: Any) -> Any:
        if not started:  # the first runner, between its read and its write
            started.append("second")
            runners.append(run_judge_grading(world.ctx, grading_id, store=world.store))
        return submission_for(*args)

    monkeypatch.setattr(grading_mod, "submission_for", second_runner_meanwhile)
    with pytest.raises(Conflict) as refused:  # claims.NotQueued
        run_judge_grading(world.ctx, grading_id, store=world.store)
    assert str(refused.value) == f"grading {grading_id} is succeeded, not queued"
    (second,) = runners
    assert second.status is JobStatus.SUCCEEDED and second.leaves_graded == 361
    assert second.model_calls == len(server.requests) > 361
    with world.ctx.session() as session:
        assert session.scalar(select(func.count()).select_from(ModelCall)) == second.model_calls


class _Killed(BaseException):
    """The runner's process dies: nothing after this line of it runs."""


@pytest.mark.sqlite_only("recovery and resuming; the claim's update runs on both in the test above")
def test_a_judge_grading_whose_runner_died_is_requeued_and_resumes_its_ungraded_leaves(
    world: World, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker was killed a hundred leaves into a grading: it stayed running for good, its
    score missing. Once silent past the stale time it is queued again as a failed try, and the
    next run grades the leaves without a grade only: none already paid is paid again."""
    monkeypatch.setattr(grading_mod, "PROGRESS_EVERY_S", 0.0)
    grading_id = _new_grading(world, server.base_url)
    write_leaf = grading_mod._Writer.leaf
    written: list[str] = []

    def dying(writer: Any, result: Any) -> None:
        write_leaf(writer, result)
        written.append(result.path)
        if len(written) == 100:
            raise _Killed

    monkeypatch.setattr(grading_mod._Writer, "leaf", dying)
    with pytest.raises(_Killed):
        run_judge_grading(world.ctx, grading_id, store=world.store)
    monkeypatch.setattr(grading_mod._Writer, "leaf", write_leaf)
    with world.ctx.session() as session:
        dead = session.get(Grading, grading_id)
        assert dead is not None and dead.status is JobStatus.RUNNING
        paid = set(
            session.scalars(
                select(LeafGrade.leaf_path).where(
                    LeafGrade.grading_id == grading_id, LeafGrade.valid
                )
            )
        )
        grade_calls_before = session.scalar(
            select(func.count()).where(ModelCall.purpose == "judge_grade")
        )
    assert len(paid) >= 100

    later = utcnow() + timedelta(seconds=claims.STALE_AFTER_S + 1)
    assert grading_recovery.recover_interrupted(world.ctx, now=later) == [grading_id]
    with world.ctx.session() as session:
        requeued = session.get(Grading, grading_id)
        assert requeued is not None
        assert (requeued.status, requeued.tries) == (JobStatus.QUEUED, 1)
        requeued.retry_at = None  # its back-off over
    outcome = run_judge_grading(world.ctx, grading_id, store=world.store)
    assert outcome.status is JobStatus.SUCCEEDED and outcome.leaves_graded == 361
    with world.ctx.session() as session:
        grade_calls_after = session.scalar(
            select(func.count()).where(ModelCall.purpose == "judge_grade")
        )
    assert 0 < (grade_calls_after or 0) - (grade_calls_before or 0) <= 361 - len(paid)


@pytest.mark.sqlite_only("the runner's own threads; the claim runs on both above")
def test_a_judge_grading_that_cannot_record_its_heartbeat_asks_for_no_more_leaves(
    world: World,
    server: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database stays locked for the heartbeat: the runner went on paying for leaves past
    the stale time, and recovery queued the grading again for a second runner to pay for the
    same leaves. Now, silent for `GIVE_UP_AFTER_S`, it asks for no more leaves once the next
    one is written, keeps the leaves it paid for and leaves the row to recovery."""
    grading_id = _new_grading(world, server.base_url)
    deadline = time.monotonic() + 10

    def slowed(body: dict[str, Any]) -> dict[str, Any]:
        """After 40 calls the endpoint answers only once the run was given up (or in 10 s)."""
        if len(server.requests) > 40:
            while "giving the run up" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.01)
        return scripted_answer(body)

    def locked(_heartbeat: object) -> bool:
        raise OperationalError("UPDATE gradings", {}, Exception("database is locked"))

    server.answer = slowed
    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.01)
    monkeypatch.setattr(claims, "GIVE_UP_AFTER_S", 0.2, raising=False)
    monkeypatch.setattr(claims.Heartbeat, "_record", locked, raising=False)
    caplog.set_level(logging.WARNING, logger=claims.__name__)
    with pytest.raises(Conflict, match=r"no heartbeat recorded for .* s; run given up"):
        run_judge_grading(world.ctx, grading_id, store=world.store)
    asked = len(server.requests)
    assert asked < 361 // 2  # not every leaf: those in flight when it gave up, at most
    with world.ctx.session() as session:
        left = session.get(Grading, grading_id)
        assert left is not None and (left.status, left.tries) == (JobStatus.RUNNING, 0)
        kept = session.scalar(
            select(func.count()).where(LeafGrade.grading_id == grading_id, LeafGrade.valid)
        )
    assert 0 < (kept or 0) <= asked


def test_the_judges_client_is_closed_however_the_grading_ends(
    world: World, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The judge's HTTP clients stayed open after every grading (an unclosed socket per
    connection, a ResourceWarning each, in a worker that grades for weeks); now they are closed
    when the grading ends, as when it fails."""
    judges: list[Judge] = []

    def judge_factory(config: JudgeConfig) -> Judge:
        judges.append(Judge(config))
        return judges[-1]

    def closed(judge: Judge) -> bool:
        shards = judge.client.transport.shards  # type: ignore[attr-defined]
        return bool(shards) and all(shard.is_closed() for shard in shards)

    done = run_judge_grading(
        world.ctx,
        _new_grading(world, server.base_url, code_dev=True),
        store=world.store,
        judge_factory=judge_factory,
    )
    assert done.status is JobStatus.SUCCEEDED and closed(judges[-1])

    def broken_database(*_args: object) -> None:
        raise RuntimeError("the leaf cannot be written")

    monkeypatch.setattr(grading_mod._Writer, "leaf", broken_database)
    with pytest.raises(RuntimeError, match="leaf cannot be written"):
        run_judge_grading(
            world.ctx,
            _new_grading(world, server.base_url, code_dev=True),
            store=world.store,
            judge_factory=judge_factory,
        )
    assert len(judges) == 2 and closed(judges[-1])
