"""The study page lists the blacklist monitor's hits for its coordinators (issue 36 item 6);
before, they were only on each attempt's page, and only once someone ran the monitor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient

from baseline.context import Context
from baseline.models import Attempt, BlacklistHit, Role, utcnow
from tests.app.chromium import chromium, console_errors, log_in, screenshot, serving
from tests.baseline.attempt_world import make_attempt
from tests.conftest import Users, login

URL = "https://github.com/baseline-demo/digits-baselines"


def _flagged(ctx: Context) -> tuple[int, int]:
    """A study with one attempt and one hit of the monitor: (study id, attempt id)."""
    attempt_id = make_attempt(ctx)
    with ctx.session() as session:
        attempt = session.get(Attempt, attempt_id)
        assert attempt is not None
        session.add(
            BlacklistHit(
                attempt_id=attempt_id,
                source="egress",
                rule=URL,
                evidence=f"GET {URL}/archive/main.zip (refused by the proxy)",
                location="egress event 7",
                at=utcnow(),
                evidence_key="k" * 64,
            )
        )
        return attempt.study_id, attempt_id


def test_the_study_page_shows_its_attempts_blacklist_hits(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    study_id, attempt_id = _flagged(ctx)
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    assert "Blacklist monitor: 1 hit to review" in page
    assert f"GET {URL}/archive/main.zip (refused by the proxy)" in page
    assert f'href="/attempts/{attempt_id}#blacklist"' in page


@pytest.fixture
def live_server(app) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with serving(app) as url:
        yield url


@pytest.mark.browser
@pytest.mark.sqlite_only("the page in a browser; the test above runs its query on both databases")
def test_the_hits_in_headless_chromium(ctx: Context, live_server: str, users: Users) -> None:
    from selenium.webdriver.common.by import By

    study_id, _ = _flagged(ctx)
    with chromium() as driver:
        log_in(driver, live_server, users[Role.COORDINATOR].email)
        driver.get(f"{live_server}/studies/{study_id}")
        section = driver.find_element(By.ID, "blacklist")
        assert "1 hit to review" in section.text and "refused by the proxy" in section.text
        assert console_errors(driver) == []
        screenshot(driver, "study-blacklist-hits")
