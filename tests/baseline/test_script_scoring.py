"""Intermediate scores of a scored task: asked during the attempt, stamped with working time.

The demo scored task runs end to end on the real dockerd: the participant's workspace holds a
solution, the scoring script runs in a separate scoring container, the clock pauses (reason
`scoring`) while it runs, and a ScoreLog row records raw and normalised score.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from baseline import clock, launch, script_scoring, studies, tasks, workspaces
from baseline.context import Context
from baseline.models import (
    Attempt,
    AttemptStatus,
    Host,
    Pause,
    PauseReason,
    ScoreLog,
    TaskKind,
    Workspace,
    utcnow,
)
from infra.docker_backend import DockerBackend
from infra.workspace import PARTICIPANT_USER, WorkspaceBackend
from tests.docker_env import LOCAL_URL, TEST_LABELS, docker_url, test_image

pytestmark = pytest.mark.docker
__all__ = ["test_image"]

TASK = Path(tasks.__file__).parent / "demo_tasks" / "digits-accuracy"


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
    yield created
    with ctx.session() as session:
        for workspace in workspaces.live_workspaces(session):
            workspaces.destroy(session, workspace, factory)


def _write_solution(ctx: Context, attempt_id: int, source: Path) -> None:
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


@pytest.mark.parametrize(
    ("solution", "expected"),
    [("reference_solution/solution.py", 1.0), ("starting/solution.py", 0.0)],
)
def test_intermediate_score_is_logged_with_working_time(
    ctx: Context, attempt_id: int, solution: str, expected: float
) -> None:
    _write_solution(ctx, attempt_id, TASK / solution)
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
