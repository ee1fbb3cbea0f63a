"""Scores of a scored task: its snapshots' gradings, and intermediate scores asked during the
attempt and stamped with working time.

The demo scored task runs end to end on the real dockerd: the participant's workspace starts with
the task's starting solution, the scoring script runs in a separate scoring container, the clock
pauses (reason `scoring`) while an intermediate score runs, and a ScoreLog row records raw and
normalised score. A solution that fails the scoring is the participant's result at the task's
floor; a scoring workspace that breaks is Baseline's failure, retried and never a score.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from baseline.attempts import attempts, clock, launch, snapshots
from baseline.context import Context
from baseline.grading import retries, script_scoring
from baseline.jobs import orchestration
from baseline.models import (
    Attempt,
    AttemptStatus,
    Grading,
    Host,
    JobStatus,
    Pause,
    PauseReason,
    ScoreLog,
    Snapshot,
    SnapshotKind,
    TaskKind,
    Workspace,
    utcnow,
)
from baseline.runs import driver_clock
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import workspaces
from infra.docker_backend import DockerBackend
from infra.snapshots import load_manifest
from infra.workspace import (
    PARTICIPANT_USER,
    Archive,
    WorkspaceBackend,
    WorkspaceError,
    WorkspaceHandle,
)
from tests.docker_env import LOCAL_URL, TEST_LABELS, docker_url, test_image

pytestmark = pytest.mark.docker
__all__ = ["test_image"]

TASK = tasks.DEMO_TASKS_DIR / "digits-accuracy"


def factory(host: Host) -> WorkspaceBackend:
    return DockerBackend.from_url(host.docker_url, labels=TEST_LABELS)


@pytest.fixture
def attempt_id(ctx: Context, test_image: str) -> Iterator[int]:
    docker_url("unix")
    with ctx.session() as session:
        host = workspaces.add_host(session, "local", LOCAL_URL, None)
        assert workspaces.check_host(session, host).healthy
        study = studies.create_study(
            session, studies.StudySpec(name="scored", egress_policy="none"), None
        )
        scored = next(
            t for t in tasks.import_demo_tasks(session, ctx.settings) if t.kind is TaskKind.SCORED
        )
        studies.add_task(session, study, scored, None)
        session.flush()
        session.refresh(study)
        agent = studies.add_agent(session, study, "agent", "basic", "m", "", None, None)
        created = studies.create_attempt(session, agent, scored, None).id
    status = launch.launch(ctx, created, None, image=test_image, backend_factory=factory)
    assert status is AttemptStatus.RUNNING
    driver_clock.driving_starts(ctx, created)  # its clock runs, as under its agent's driver
    yield created
    with ctx.session() as session:
        for workspace in workspaces.live_workspaces(session):
            workspaces.destroy(session, workspace, factory)


def write_solution(ctx: Context, attempt_id: int, source: Path) -> None:
    """Put `source` in the attempt's submission as solution.py, as its participant."""
    with ctx.session() as session:
        query = select(Workspace).where(Workspace.attempt_id == attempt_id)
        handle = workspaces.handle_of(session.scalars(query).one())
    encoded = base64.b64encode(source.read_bytes()).decode()
    backend = DockerBackend.from_url(LOCAL_URL, labels=TEST_LABELS)
    try:
        result = backend.exec(
            handle,
            ["bash", "-c", f"echo {encoded} | base64 -d > /home/submission/solution.py"],
            user=PARTICIPANT_USER,
            timeout_s=30,
        )
    finally:
        backend.close()
    assert result.exit_code == 0, result.output


@pytest.mark.sqlite_only("the scoring container's result and the score log")
@pytest.mark.parametrize(
    ("solution", "expected"),
    [("reference_solution/solution.py", 1.0), ("starting/solution.py", 0.0)],
)
def test_intermediate_score_is_logged_with_working_time(
    ctx: Context, attempt_id: int, solution: str, expected: float
) -> None:
    write_solution(ctx, attempt_id, TASK / solution)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        before = clock.attempt_working_s(attempt, utcnow())

    log = script_scoring.intermediate_score(ctx, attempt_id, None, backend_factory=factory)

    assert log.error is None
    assert log.normalised_score == pytest.approx(expected, abs=0.01)
    assert log.working_s >= before
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None and attempt.status is AttemptStatus.RUNNING
        scoring_pauses = session.scalars(
            select(Pause).where(Pause.attempt_id == attempt_id, Pause.reason == PauseReason.SCORING)
        ).all()
        assert len(scoring_pauses) == 1 and scoring_pauses[0].ended_at is not None
        assert session.scalars(select(ScoreLog.normalised_score)).all() == [log.normalised_score]
    # The protected split never reached the participant's workspace.
    with ctx.session() as session:
        query = select(Workspace).where(Workspace.attempt_id == attempt_id)
        handle = workspaces.handle_of(session.scalars(query).one())
    backend = DockerBackend.from_url(LOCAL_URL, labels=TEST_LABELS)
    try:
        found = backend.exec(handle, ["bash", "-c", "find / -name split.json 2>/dev/null"])
    finally:
        backend.close()
    assert found.output.strip() == b""


def test_an_intermediate_score_inside_a_pause_is_taken_in_that_pause(
    ctx: Context, attempt_id: int
) -> None:
    """A coordinator's pause (or an agent waiting for its driver) already stops the clock: the
    score is taken inside it, with no scoring pause of its own, and the pause stays open."""
    write_solution(ctx, attempt_id, TASK / "reference_solution/solution.py")
    attempts.pause(ctx, attempt_id, PauseReason.ADMIN, None, note="a coordinator's pause")
    log = script_scoring.intermediate_score(ctx, attempt_id, None, backend_factory=factory)
    assert log.error is None and log.normalised_score == pytest.approx(1.0, abs=0.01)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        open_pause = clock.open_pause(attempt)
        assert open_pause is not None and open_pause.reason is PauseReason.ADMIN
        reasons = session.scalars(select(Pause.reason).where(Pause.attempt_id == attempt_id))
        assert PauseReason.SCORING not in reasons.all()


def test_the_start_snapshot_holds_the_starting_solution_and_scores_zero(
    ctx: Context, attempt_id: int
) -> None:
    """RE-Bench's t = 0: the submission starts as the task's starting solution, so the start
    snapshot scores the starting score (normalised 0), not a failure on an empty folder."""
    with ctx.session() as session:
        start = session.scalars(
            select(Snapshot).where(
                Snapshot.attempt_id == attempt_id, Snapshot.kind == SnapshotKind.START
            )
        ).one()
        manifest = load_manifest(snapshots.store_for(ctx), start.manifest_sha256)
        assert [e.path for e in manifest.entries if e.path.endswith(".py")] == ["solution.py"]
        grading_id = script_scoring.create_script_grading(session, start).id

    done = script_scoring.run_script_grading(ctx, grading_id, backend_factory=factory)

    assert (done.status, done.floor_reason, done.error) == (JobStatus.SUCCEEDED, None, None)
    assert done.score == pytest.approx(0.0, abs=0.01)


@pytest.mark.sqlite_only("the scoring script's failure class")
def test_a_solution_that_fails_the_scoring_is_a_result_at_the_floor(
    ctx: Context, attempt_id: int, tmp_path: Path
) -> None:
    broken = tmp_path / "solution.py"
    broken.write_text("raise RuntimeError('not written yet')\n")
    write_solution(ctx, attempt_id, broken)

    log = script_scoring.intermediate_score(ctx, attempt_id, None, backend_factory=factory)
    assert (log.normalised_score, log.raw_score, log.floor_reason) == (
        0.0,
        0.8555555555555555,
        "no_score",
    )
    assert (log.error or "").startswith("no_score: solution.py failed")

    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        source = snapshots.resolve_source(session, attempt)
    snap = snapshots.take_snapshot(ctx, attempt_id, SnapshotKind.MANUAL, None, source)
    with ctx.session() as session:
        grading_id = script_scoring.create_script_grading(session, snap).id
    done = script_scoring.run_script_grading(ctx, grading_id, backend_factory=factory)
    assert (done.status, done.score, done.raw_score, done.floor_reason) == (
        JobStatus.SUCCEEDED,
        0.0,
        0.8555555555555555,
        "no_score",
    )
    assert "RuntimeError: not written yet" in (done.error or "")


class _BrokenScoringHost(DockerBackend):
    """A Docker host that stops taking files: Baseline's failure, not the participant's."""

    def put_archive(self, handle: WorkspaceHandle, path: str, archive: Archive) -> None:
        raise WorkspaceError("the Docker daemon stopped answering")


def test_a_scoring_that_cannot_run_is_retried_and_never_a_score(
    ctx: Context, attempt_id: int
) -> None:
    def broken(host: Host) -> WorkspaceBackend:
        return _BrokenScoringHost.from_url(host.docker_url, labels=TEST_LABELS)

    with ctx.session() as session:
        start = session.scalars(
            select(Snapshot).where(
                Snapshot.attempt_id == attempt_id, Snapshot.kind == SnapshotKind.START
            )
        ).one()
        grading_id = script_scoring.create_script_grading(session, start).id

    done = script_scoring.run_script_grading(ctx, grading_id, backend_factory=broken)
    assert (done.status, done.score, done.floor_reason, done.tries) == (
        JobStatus.QUEUED,
        None,
        None,
        1,
    )
    assert done.retry_at is not None
    assert "scoring could not run" in (done.error or "")
    assert "the Docker daemon stopped answering" in (done.error or "")

    for _ in range(retries.MAX_TRIES - 1):
        with ctx.session() as session:
            grading = session.get(Grading, grading_id)
            assert grading is not None and grading.status is JobStatus.QUEUED
            grading.retry_at = utcnow() - timedelta(seconds=1)
        orchestration.process_queue(ctx, attempt_id=attempt_id, backend_factory=broken)
    with ctx.session() as session:
        grading = session.get(Grading, grading_id)
        assert grading is not None
        assert (grading.status, grading.score, grading.tries) == (
            JobStatus.FAILED,
            None,
            retries.MAX_TRIES,
        )
        assert (grading.error or "").startswith("failed 3 times; last error: scoring could not")
