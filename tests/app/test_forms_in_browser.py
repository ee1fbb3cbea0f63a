"""A form is sent once in a browser: a second click while the portal is still answering the first
does not send it again (`app/static/forms.js`), so "New attempt" clicked twice makes one attempt."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from baseline.context import Context
from baseline.models import Attempt, Role
from baseline.studies import studies
from tests.app.chromium import chromium, log_in, serving
from tests.baseline.attempt_world import make_attempt
from tests.conftest import Users

# What a person does who clicks again because nothing seemed to happen: the second click comes
# while the first request is still being answered (slowed down below, as on a loaded portal).
CLICK_TWICE = """
const button = document.querySelector("form[action$='/attempts'] button");
button.click();
setTimeout(() => button.click(), 300);
"""


@pytest.fixture
def live_server(app, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:  # type: ignore[no-untyped-def]
    create = studies.create_attempt

    def slowly(*args: Any, **kwargs: Any) -> Attempt:
        time.sleep(1.5)
        return create(*args, **kwargs)

    monkeypatch.setattr(studies, "create_attempt", slowly)
    with serving(app) as url:
        yield url


def _attempts(ctx: Context, study_id: int) -> int:
    with ctx.session() as session:
        query = select(func.count()).select_from(Attempt).where(Attempt.study_id == study_id)
        return int(session.scalar(query) or 0)


@pytest.mark.browser
@pytest.mark.sqlite_only("the page in a browser")
def test_new_attempt_clicked_twice_makes_one_attempt(
    ctx: Context, live_server: str, users: Users
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    first = make_attempt(ctx)
    with ctx.session() as session:
        attempt = session.get(Attempt, first)
        assert attempt is not None
        study_id = attempt.study_id
    with chromium() as driver:
        log_in(driver, live_server, users[Role.COORDINATOR].email)
        driver.get(f"{live_server}/studies/{study_id}")
        driver.execute_script(CLICK_TWICE)
        WebDriverWait(driver, 30).until(lambda d: "/attempts/" in d.current_url)
        time.sleep(2.0)  # a second request, had one been sent, is answered by now
        assert "created; launch it when ready" in driver.find_element(By.TAG_NAME, "main").text
    assert _attempts(ctx, study_id) == 2  # the one made before, and one
