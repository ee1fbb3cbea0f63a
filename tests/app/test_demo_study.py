"""The demo's synthetic study is internally consistent and backed by real content, its grading
queue is blind, and a background grading that keeps failing is retried, then marked failed."""

from __future__ import annotations

import io
import re
import statistics
import tarfile
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from flask import Flask
from sqlalchemy import select

from analysis.seed import seed_synthetic_study
from baseline.attempts import clock
from baseline.attempts.snapshots import export_snapshot, store_for
from baseline.context import Context
from baseline.grading import expert_grading, retries
from baseline.grading.grading import task_rubric_and_materials
from baseline.jobs import orchestration
from baseline.models import (
    Attempt,
    Grading,
    GradingKind,
    JobStatus,
    ParticipantKind,
    Reproduction,
    Role,
    Snapshot,
    Study,
    Task,
    TaskKind,
    utcnow,
)
from infra.snapshots import load_manifest
from scoring.failure import FailureClass
from scoring.scored_task import ScoringSpec
from tests.conftest import SeededStudy, Users, login

# What these tests read is the seeded files (blob store), the same on either database; the
# tests of the rows, the queue and the pages run on both.
files_only = pytest.mark.sqlite_only("checks the seeded files, not the rows")


@pytest.fixture
def study(ctx: Context) -> Study:
    """The demo's study with real content behind every snapshot and task file."""
    with ctx.session() as session:
        return seed_synthetic_study(session, name="demo test", seed=0, store=store_for(ctx))


# Seeded once per run; each test that uses the fixture below starts on a copy.
SEEDED_STUDY = SeededStudy("demo test", seed=0, fixture="rows_only")


@pytest.fixture
def rows_only(ctx: Context) -> Study:
    """The same study's rows without their content (a tenth of the time): for the tests of the
    rows, the queue and the worker, which read no file."""
    with ctx.session() as session:
        return seed_synthetic_study(session, name="demo test", seed=0)


@files_only
def test_every_snapshot_is_real_content(ctx: Context, study: Study) -> None:
    store = store_for(ctx)
    with ctx.session() as session:
        snapshots = session.scalars(
            select(Snapshot).join(Attempt).where(Attempt.study_id == study.id)
        ).all()
        assert len(snapshots) > 100
        for snap in snapshots[::7]:
            manifest = load_manifest(store, snap.manifest_sha256)
            assert snap.file_count == len(manifest.files) > 0
            assert all(store.exists(e.sha256) for e in manifest.files if e.sha256)
            out = io.BytesIO()
            export_snapshot(session, store, snap.id, out)
            with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as archive:
                names = archive.getnames()
            assert "submission/SYNTHETIC.md" in names


@files_only
def test_a_submission_reproduced_as_missing_its_reproduce_sh_lacks_it(
    ctx: Context, study: Study
) -> None:
    """The grading page said "missing reproduce.sh" above a file list holding reproduce.sh, and
    that it ran 20 minutes."""
    store = store_for(ctx)
    with ctx.session() as session:
        reproduced = session.execute(
            select(Snapshot.manifest_sha256, Reproduction.failure_class, Reproduction.duration_s)
            .join(Reproduction, Reproduction.snapshot_id == Snapshot.id)
            .join(Attempt)
            .where(Attempt.study_id == study.id)
        ).all()
    has_script = {
        failure: {
            any(e.path == "reproduce.sh" for e in load_manifest(store, manifest).files)
            for manifest, f, _ in reproduced
            if (f == FailureClass.MISSING_REPRODUCE_SH) == (failure == "missing")
        }
        for failure in ("missing", "other")
    }
    assert has_script == {"missing": {False}, "other": {True}}
    missing_ran = {s for _, f, s in reproduced if f == FailureClass.MISSING_REPRODUCE_SH}
    others_ran = {s for _, f, s in reproduced if f != FailureClass.MISSING_REPRODUCE_SH}
    assert (missing_ran, others_ran) == ({2.0}, {1200.0})


@files_only
def test_tasks_have_rubrics_and_valid_scoring(ctx: Context, study: Study) -> None:
    store = store_for(ctx)
    with ctx.session() as session:
        made = session.scalars(select(Task).where(Task.slug.like(f"synthetic-{study.id}-%")))
        kinds: Counter[TaskKind] = Counter()
        for task in made:
            kinds[task.kind] += 1
            if task.kind is TaskKind.PAPER:
                rubric, materials = task_rubric_and_materials(session, store, task)
                assert list(rubric.leaves()) and materials.paper
                # the tasks page and the judge's cost estimate read the rubric's size here
                assert task.summary["leaves"] == len(list(rubric.leaves()))
                assert task.summary["synthetic"] is True
            else:
                fields = set(
                    ScoringSpec.model_fields
                )  # as baseline.grading.script_scoring reads it
                assert task.scoring is not None
                ScoringSpec.model_validate({k: v for k, v in task.scoring.items() if k in fields})
        assert kinds[TaskKind.PAPER] and kinds[TaskKind.SCORED]


def test_worked_time_never_exceeds_the_limit(ctx: Context, rows_only: Study) -> None:
    with ctx.session() as session:
        for attempt in session.scalars(select(Attempt).where(Attempt.study_id == rows_only.id)):
            state = clock.state(attempt)
            assert state.working_s <= attempt.working_time_limit_s + 1e-6, attempt.id
            last = max(s.taken_working_s for s in attempt.snapshots)
            assert state.working_s == pytest.approx(last, abs=1.0), attempt.id


def test_the_worker_leaves_synthetic_snapshots_alone(ctx: Context, rows_only: Study) -> None:
    found = orchestration.discover(ctx)
    assert not (found.reproductions or found.judge_gradings or found.script_gradings)


def test_grading_queue_is_blind(ctx: Context, rows_only: Study) -> None:
    with ctx.session() as session:
        queue = expert_grading.gradable(session)
        kind_of = {
            s.id: s.attempt.participant.kind
            for s in session.scalars(select(Snapshot).join(Attempt))
        }
        pseudonyms = {
            p.kind: p.pseudonym for a in session.scalars(select(Attempt)) for p in [a.participant]
        }
    assert all(re.fullmatch(r"P-[0-9A-F]{6}", p) for p in pseudonyms.values())
    assert all(re.fullmatch(r"S-[0-9A-F]{6}", row.pseudonym) for row in queue)
    per_label: dict[ParticipantKind, list[int]] = defaultdict(list)
    counts = Counter((row.pseudonym, row.task_title) for row in queue)
    label_kind = {row.pseudonym: kind_of[row.id] for row in queue}
    for (label, _task), n in counts.items():
        per_label[label_kind[label]].append(n)
    # As many snapshots per label for humans as for agents (one attempt's checkpoints each).
    human, agent = per_label[ParticipantKind.HUMAN], per_label[ParticipantKind.AGENT]
    assert max(human) == max(agent) and abs(statistics.mean(human) - statistics.mean(agent)) < 1.5
    # The order is not by id, and humans are spread through the queue, not bunched.
    ids = [row.id for row in queue]
    assert ids != sorted(ids)
    positions = [
        i / len(queue) for i, row in enumerate(queue) if kind_of[row.id] is ParticipantKind.HUMAN
    ]
    assert 0.35 < statistics.mean(positions) < 0.65


def test_the_study_page_asks_no_judge_for_synthetic_paper_tasks(
    app: Flask, users: Users, rows_only: Study
) -> None:
    """It said their snapshots "are reproduced but never graded: their scores stay empty" above
    curves drawn from those scores: a synthetic task's scores are drawn, never graded."""
    client = app.test_client()
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{rows_only.id}").get_data(as_text=True)
    assert "Synthetic paper task 1" in page
    assert 'id="no-judge"' not in page and "needs a judge" not in page


def test_grading_pages_work_on_the_demo_data(
    app: Flask, ctx: Context, users: Users, study: Study
) -> None:
    client = app.test_client()
    login(client, users[Role.GRADER].email)
    page = client.get("/grading/").get_data(as_text=True)
    ids = re.findall(r"/grading/snapshot\?snapshot=(\d+)", page)
    assert ids
    for snapshot_id in ids[:3]:
        assert client.get(f"/grading/snapshot?snapshot={snapshot_id}").status_code == 200
        assert client.get(f"/grading/diff?snapshot={snapshot_id}").status_code == 200
        assert client.get(f"/grading/log?snapshot={snapshot_id}").status_code in (200, 404)
        assert (
            client.get(f"/grading/file?snapshot={snapshot_id}&path=SYNTHETIC.md").status_code == 200
        )


def test_a_failing_grading_is_retried_then_marked_failed(
    ctx: Context, rows_only: Study, app: Flask, users: Users, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ctx.session() as session:
        snap = session.scalars(
            select(Snapshot)
            .join(Attempt)
            .join(Task)
            .where(Attempt.study_id == rows_only.id, Task.kind == TaskKind.SCORED)
        ).first()
        assert snap is not None
        snap.source = "workspace"  # a real snapshot as far as the worker knows
        attempt_id = snap.attempt_id
        for old in session.scalars(select(Grading).where(Grading.snapshot_id == snap.id)):
            session.delete(old)
        snapshot_id = snap.id

    def broken(*_args: object, **_kwargs: object) -> Grading:
        raise RuntimeError("the scoring host is unreachable")

    monkeypatch.setattr(orchestration, "run_script_grading", broken)
    for attempt_no in range(1, retries.MAX_TRIES + 1):
        orchestration.process_queue(ctx, attempt_id=attempt_id)
        with ctx.session() as session:
            grading = session.scalars(
                select(Grading).where(
                    Grading.snapshot_id == snapshot_id, Grading.kind == GradingKind.SCRIPT
                )
            ).one()
            assert grading.tries == attempt_no
            if attempt_no < retries.MAX_TRIES:
                assert grading.status is JobStatus.QUEUED
                assert grading.retry_at is not None and grading.retry_at > utcnow()
                # Within the back-off, the next pass does not run it again.
                orchestration.process_queue(ctx, attempt_id=attempt_id)
                again = session.get(Grading, grading.id)
                assert again is not None and again.tries == attempt_no
                grading.retry_at = utcnow() - timedelta(seconds=1)
    with ctx.session() as session:
        failed = session.get(Grading, grading.id)
        assert failed is not None and failed.status is JobStatus.FAILED
        assert "unreachable" in (failed.error or "")
    client = app.test_client()
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/grading/attempt/{attempt_id}").get_data(as_text=True)
    assert "failed 3 times" in page and "unreachable" in page


def test_a_failing_reproduction_is_retried_then_marked_failed(
    ctx: Context, rows_only: Study, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ctx.session() as session:
        snap = session.scalars(
            select(Snapshot)
            .join(Attempt)
            .join(Task)
            .where(Attempt.study_id == rows_only.id, Task.kind == TaskKind.PAPER)
        ).first()
        assert snap is not None
        snap.source = "workspace"
        for old in session.scalars(select(Grading).where(Grading.snapshot_id == snap.id)):
            session.delete(old)
        for repro in session.scalars(
            select(Reproduction).where(Reproduction.snapshot_id == snap.id)
        ):
            session.delete(repro)
        snapshot_id, attempt_id = snap.id, snap.attempt_id

    def broken(*_args: object, **_kwargs: object) -> Reproduction:
        raise RuntimeError("docker daemon went away")

    monkeypatch.setattr(orchestration, "run_reproduction", broken)
    for attempt_no in range(1, retries.MAX_TRIES + 1):
        orchestration.process_queue(ctx, attempt_id=attempt_id)
        with ctx.session() as session:
            repro = session.scalars(
                select(Reproduction).where(Reproduction.snapshot_id == snapshot_id)
            ).one()
            assert repro.tries == attempt_no
            repro.retry_at = utcnow() - timedelta(seconds=1)
    with ctx.session() as session:
        repro = session.scalars(
            select(Reproduction).where(Reproduction.snapshot_id == snapshot_id)
        ).one()
        assert repro.status is JobStatus.FAILED
        assert "docker daemon went away" in (repro.error or "")
