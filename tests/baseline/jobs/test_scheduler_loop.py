"""The scheduler's loop thread survives what APScheduler's own loop does not."""

from __future__ import annotations

import pytest
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler

from baseline.jobs.scheduler import _StoppableScheduler


def test_a_job_gone_before_its_removal_does_not_end_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """APScheduler removes a date job it has just run; when the job was gone by then (seen at
    the demo's shutdown) the JobLookupError ended the loop's thread, and every checkpoint after
    it was never taken. Now the loop looks at the due jobs again at once."""

    def job_gone(_self: BackgroundScheduler) -> float | None:
        raise JobLookupError("attempt-57")

    scheduler = _StoppableScheduler()
    scheduler.start(paused=True)
    try:
        monkeypatch.setattr(BackgroundScheduler, "_process_jobs", job_gone)
        assert scheduler._process_jobs() == 0.0
    finally:
        monkeypatch.undo()
        scheduler.shutdown(wait=False)
