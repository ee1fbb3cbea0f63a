"""The monitor page in headless Chromium while a time-scaled study runs: the snapshot scheduler
takes checkpoints on a clock of 10 working minutes per wall second, an idle-participant alert
fires, and the page shows each without a reload; the coordinator acknowledges the alert there.

Screenshots go to BASELINE_SCREENSHOTS when it is set (a CI artifact)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.blueprints import monitor as monitor_page
from baseline.attempts import attempts
from baseline.context import Context
from baseline.jobs.scheduler import SnapshotScheduler
from baseline.models import Attempt, Host, ModelCall, PauseReason, Role
from baseline.monitor import alerts, settings
from baseline.studies import studies
from tests.app.chromium import chromium, console_errors, log_in, screenshot, serving
from tests.baseline.attempt_world import directory_resolver, make_attempt
from tests.conftest import Users


@pytest.fixture
def live_server(app, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(monitor_page, "POLL_MS", 400)  # the page polls every 0.4 s here
    with serving(app) as url:
        yield url


@pytest.mark.browser
@pytest.mark.sqlite_only("the page in a browser")
def test_the_monitor_follows_a_running_time_scaled_study(
    ctx: Context, live_server: str, users: Users, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # 8 working hours are 48 wall seconds: the attempt stays live through the test on a busy machine
    attempt_id = make_attempt(ctx, checkpoints=(0.5, 1.0), limit_hours=8.0, time_scale=600)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        study_id = attempt.study_id
        session.add(
            Host(name="gpu-b", docker_url="ssh://baseline@gpu-b", healthy=False, enabled=True,
                 last_error="ssh: connect to host gpu-b port 22: Connection refused",
                 gpus=[{"index": 0}, {"index": 1}])
        )  # fmt: skip
        # the judge's spend so far: whole dollars with thousands separators fit the summary card
        session.add(ModelCall(study_id=study_id, purpose="judge", model="m", cost_usd=12647.6))
        limits = settings.Thresholds(
            idle_minutes=15, snapshot_late_minutes=None, queue_minutes=None, host_down=False
        )
        settings.save(
            session,
            studies.get_study(session, study_id),
            settings.MonitorConfig(thresholds=limits),
            None,
        )
    resolver = directory_resolver(tmp_path)
    runner = SnapshotScheduler(ctx, resolver, sweep_every_s=0.5)
    with chromium() as driver:
        log_in(driver, live_server, users[Role.COORDINATOR].email)
        driver.get(f"{live_server}/studies/{study_id}/monitor")
        row = f"#attempts-table tr[data-attempt='{attempt_id}']"
        WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, row))

        def text(selector: str) -> str:
            """An element's text read in one step: the page redraws its rows as it polls."""
            return str(
                driver.execute_script(f"return document.querySelector({selector!r}).innerText;")
            )

        assert "not started" in text(row)
        driver.execute_script("window.notReloaded = true;")

        attempts.start(ctx, attempt_id, None, resolver)  # the clock runs: an agent's starts now
        runner.start()
        try:
            # the page shows the clock running, then a checkpoint the scheduler takes. The row
            # shows the working time it was taken at: at 10 working minutes per wall second, a
            # pass 0.1 s late on a busy machine shows 0:31, and one 3 s late takes both at once
            WebDriverWait(driver, 20, poll_frequency=0.2).until(
                lambda d: re.search(r"checkpoint at (0:[3-5]\d|1:\d\d):\d\d", text(row))
            )
            screenshot(driver, "monitor-running")
            # 15 idle working minutes pass in 1.5 s: the rule fires and the page shows it

            def alert_shown(d: Any) -> bool:
                alerts.evaluate_and_deliver(ctx, study_id)  # what the scheduler's job does
                return bool(d.find_elements(By.CSS_SELECTOR, "#alerts-table tr.alerting"))

            WebDriverWait(driver, 10, poll_frequency=0.2).until(alert_shown)
            alert_row = text("#alerts-table tr.alerting")
            assert "idle" in alert_row and f"attempt:{attempt_id}" in alert_row
            assert driver.execute_script(
                f"return document.querySelector({row!r}).classList.contains('alerting');"
            )
            assert driver.execute_script("return window.notReloaded === true;")
            summary = text("#mon-summary")
            assert "Open alerts\n1" in summary and "Hosts up\n0 / 1" in summary
            assert "Spend\n$12,648\nno budget set" in summary
            host = text("#hosts-table tbody tr")
            assert "gpu-b" in host and "down" in host and "0 / 2" not in host
            screenshot(driver, "monitor-alert")
        finally:
            runner.shutdown()
        # a long pause history: the cell says how many and why the last was taken, its tooltip
        # every one with its note, and the table still fits its card beside the page's dozen
        # columns
        for n in range(1, 8):
            note = f"host gpu-b unreachable, try {n} of the morning's maintenance window"
            attempts.pause(ctx, attempt_id, PauseReason.OUTAGE, None, note=note)
            attempts.resume(ctx, attempt_id, None)
        pauses = f"{row} td.pauses"
        WebDriverWait(driver, 10, poll_frequency=0.2).until(
            lambda d: text(pauses) == "7 (last: outage)"
        )
        tooltip = driver.execute_script(f"return document.querySelector({pauses!r}).title;")
        assert len(tooltip.splitlines()) == 7 and "try 1 of" in tooltip
        assert tooltip.splitlines()[-1] == f"outage \u2014 {note}"
        assert driver.execute_script(
            "const wrap = document.querySelector('#attempts .mon-wrap');"
            "return wrap.scrollWidth <= wrap.clientWidth;"
        ), "the attempts table is wider than its card"
        # sorting: by working time, descending, then the filter hides agents
        header = driver.find_element(By.CSS_SELECTOR, "th[data-key='working_s']")
        header.click()
        header.click()
        assert "sorted-desc" in header.get_attribute("class")
        driver.execute_script(  # acknowledge (by script: the poll redraws the row meanwhile)
            "document.querySelector('#alerts-table tr.alerting button').click();"
        )
        WebDriverWait(driver, 10).until(
            lambda d: (
                users[Role.COORDINATOR].name
                in d.find_element(By.CSS_SELECTOR, "#alerts-table tbody tr").text
            )
        )
        from selenium.webdriver.support.select import Select

        Select(driver.find_element(By.ID, "f-kind")).select_by_value("human")
        driver.execute_script(
            "document.getElementById('f-kind').dispatchEvent(new Event('input'));"
        )
        assert driver.find_element(By.ID, "attempt-count").text == "0 of 1"
        screenshot(driver, "monitor-acknowledged")
        assert console_errors(driver) == []
