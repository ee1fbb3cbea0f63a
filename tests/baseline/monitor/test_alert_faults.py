"""Alert rules driven by real faults on the real dockerd: a scoring script that fails, a killed
workspace that is not restarted, a host that stops answering. Each fires once, is delivered by
e-mail and webhook, and clears when the fault is mended.

One scored attempt (the demo's digits task) serves all three faults: launching it is the cost.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from baseline.attempts import snapshots
from baseline.context import Context
from baseline.grading import script_scoring
from baseline.models import (
    Alert,
    AlertDelivery,
    AlertRule,
    Attempt,
    Host,
    JobStatus,
    SnapshotKind,
    Workspace,
    WorkspaceStatus,
)
from baseline.monitor import alerts, settings
from baseline.studies import studies
from baseline.tasks import tasks
from baseline.workspaces import workspaces
from infra.docker_backend import DockerBackend
from tests.baseline.grading.test_script_scoring import attempt_id, factory, write_solution
from tests.baseline.monitor.conftest import Hook, Mailbox
from tests.docker_env import LOCAL_URL, test_image

pytestmark = [
    pytest.mark.docker,
    pytest.mark.sqlite_only("the alert rules read the system's faults, not the storage"),
]
__all__ = ["attempt_id", "test_image"]  # fixtures the tests use

TASK = tasks.DEMO_TASKS_DIR / "digits-accuracy"


@pytest.fixture
def scored_attempt(ctx: Context, attempt_id: int) -> tuple[int, int]:
    """(study id, attempt id) of a running scored attempt on the local dockerd (the scoring
    tests' attempt)."""
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        return attempt.study_id, attempt.id


def _grade_now(ctx: Context, attempt_id: int) -> JobStatus:
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        source = snapshots.resolve_source(session, attempt)
    snap = snapshots.take_snapshot(ctx, attempt_id, SnapshotKind.MANUAL, None, source)
    with ctx.session() as session:
        grading_id = script_scoring.create_script_grading(session, snap).id
    return script_scoring.run_script_grading(ctx, grading_id, backend_factory=factory).status


def _rule_of(ctx: Context, alert_ids: list[int]) -> list[AlertRule]:
    with ctx.session() as session:
        return [a.rule for a in session.scalars(select(Alert).where(Alert.id.in_(alert_ids)))]


def test_real_faults_fire_once_are_delivered_and_clear(
    ctx: Context, scored_attempt: tuple[int, int], tmp_path: Path, smtp: Mailbox, steady_hook: Hook
) -> None:
    study_id, attempt_id = scored_attempt
    limits = settings.Thresholds(
        idle_minutes=None,
        snapshot_late_minutes=None,
        queue_minutes=None,
        spend_share=None,
        failure_rate=0.5,
        failure_min_count=1,
    )
    with ctx.session() as session:
        study = studies.get_study(session, study_id)
        config = settings.MonitorConfig(
            thresholds=limits, email_to=["coord@test.example"], webhook_url=steady_hook.url
        )
        settings.save(session, study, config, None)
    assert alerts.evaluate_and_deliver(ctx, study_id).fired == []

    # 1. the task's scoring script fails on the participant's solution
    broken = tmp_path / "solution.py"
    broken.write_text("raise RuntimeError('not written yet')\n")
    write_solution(ctx, attempt_id, broken)
    _grade_now(ctx, attempt_id)
    fired = alerts.evaluate_and_deliver(ctx, study_id).fired
    assert _rule_of(ctx, fired) == [AlertRule.FAILURE_RATE]
    assert alerts.evaluate_and_deliver(ctx, study_id).fired == []  # once

    # 2. the workspace's container is killed, and the reconcile does not restart it
    with ctx.session() as session:
        ws = session.scalars(select(Workspace).where(Workspace.attempt_id == attempt_id)).one()
        backend = factory(session.get(Host, ws.host_id))  # type: ignore[arg-type]
        assert isinstance(backend, DockerBackend)
        backend.client.containers.get(ws.name).kill()
        report = workspaces.reconcile(session, factory, restart_dead=False)
        assert report.died == [ws.name]
    dead = alerts.evaluate_and_deliver(ctx, study_id).fired
    assert _rule_of(ctx, dead) == [AlertRule.WORKSPACE_DEAD]
    assert alerts.evaluate_and_deliver(ctx, study_id).fired == []
    with ctx.session() as session:
        ws = session.scalars(select(Workspace).where(Workspace.attempt_id == attempt_id)).one()
        workspaces.restart(session, ws, factory)
        assert ws.status is WorkspaceStatus.RUNNING
    assert alerts.evaluate_and_deliver(ctx, study_id).cleared == dead

    # 3. a host stops answering (nothing listens at its SSH address)
    with ctx.session() as session:
        far = workspaces.add_host(session, "far", "ssh://baseline@127.0.0.1:1", None)
        assert not workspaces.check_host(session, far).healthy
        far_id = far.id
    down = alerts.evaluate_and_deliver(ctx, study_id).fired
    assert _rule_of(ctx, down) == [AlertRule.HOST_DOWN]
    assert alerts.evaluate_and_deliver(ctx, study_id).fired == []
    with ctx.session() as session:  # it answers again (at the engine's address)
        again = session.get(Host, far_id)
        assert again is not None
        again.docker_url = LOCAL_URL
        assert workspaces.check_host(session, again).healthy
    assert alerts.evaluate_and_deliver(ctx, study_id).cleared == down

    # the scoring is mended: a working solution scores, 1 failure in 2 is not above half
    write_solution(ctx, attempt_id, TASK / "reference_solution" / "solution.py")
    assert _grade_now(ctx, attempt_id) is JobStatus.SUCCEEDED
    assert alerts.evaluate_and_deliver(ctx, study_id).cleared == fired

    # every firing and clearing went out by e-mail and to the webhook, each recorded
    with ctx.session() as session:
        rows = session.scalars(select(AlertDelivery).order_by(AlertDelivery.id)).all()
        outcomes = {(r.alert_id, r.channel, r.event, r.ok) for r in rows}
    expected = {
        (alert_id, channel, event, True)
        for alert_id in (*fired, *dead, *down)
        for channel in ("email", "webhook")
        for event in ("fired", "cleared")
    }
    assert outcomes == expected and len(rows) == 12
    assert len(smtp.messages) == 6 and len(steady_hook.requests) == 6
