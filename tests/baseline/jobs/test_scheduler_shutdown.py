"""A scheduler that was shut down runs nothing more (`baseline.jobs.scheduler`'s own scheduler).

APScheduler's loop, woken by the shutdown or by a job falling due at that instant, went through
the due jobs once more: it submitted a due job to the executor the shutdown had closed, logged
"Error submitting job" with a traceback, and its thread died removing the job (the live demo's
shutdown). The loop's pass after the shutdown is what is called here.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from baseline.context import Context
from baseline.jobs.scheduler import make_scheduler
from baseline.models import utcnow

RAN: list[str] = []


def _job() -> None:
    RAN.append("ran")


@pytest.mark.sqlite_only  # the job store is incidental: the loop's pass is what is checked
def test_a_shut_down_scheduler_submits_no_job_due_at_that_moment(
    ctx: Context, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = make_scheduler(ctx)
    scheduler.start(paused=True)
    scheduler.add_job(
        f"{__name__}:_job", "date", run_date=utcnow() - timedelta(seconds=1), id="due-now"
    )
    scheduler.shutdown(wait=False)
    with caplog.at_level(logging.INFO, logger="apscheduler"):
        scheduler._process_jobs()  # the loop's pass when the shutdown wakes it
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert RAN == []
