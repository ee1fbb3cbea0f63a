"""The scheduler evaluates the alert rules of every active study periodically, as its own job."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from baseline.context import Context
from baseline.jobs.scheduler import ALERTS_EVERY_S, start_scheduler
from baseline.models import Alert, AlertRule, ModelCall, StudyStatus
from baseline.monitor import settings
from baseline.studies import studies
from tests.baseline.attempt_world import directory_resolver, make_attempt


@pytest.mark.sqlite_only("the scheduler's job list, not the storage")
def test_the_scheduler_runs_the_alert_rules_of_active_studies(ctx: Context, tmp_path: Path) -> None:
    make_attempt(ctx)
    make_attempt(ctx)
    with ctx.session() as session:
        active, draft = studies.list_studies(session)[:2]
        studies.set_status(session, active, StudyStatus.ACTIVE, None)
        for study in (active, draft):
            config = settings.MonitorConfig(budget_usd=1.0)
            settings.save(session, study, config, None)
            session.add(
                ModelCall(study_id=study.id, purpose="judge_grade", model="j", cost_usd=0.9)
            )
        active_id = active.id
    runner = start_scheduler(ctx, directory_resolver(tmp_path))
    try:
        job = runner.scheduler.get_job("monitor-alerts")
        assert job is not None and job.trigger.interval.total_seconds() == ALERTS_EVERY_S
        job.func(*job.args)  # one run of the periodic job, as the scheduler makes it
    finally:
        runner.shutdown()
    with ctx.session() as session:
        found = [(a.study_id, a.rule) for a in session.scalars(select(Alert))]
    assert found == [(active_id, AlertRule.SPEND)]  # the draft study is not watched
