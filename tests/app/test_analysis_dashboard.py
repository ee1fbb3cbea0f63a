"""The analyst dashboard: access, filters, figures; and the page rendered in headless Chromium."""

from __future__ import annotations

import html
from collections.abc import Iterator

import pytest
from flask.testing import FlaskClient

import analysis
from analysis.seed import seed_synthetic_study
from baseline.context import Context
from baseline.models import Role, Study
from tests.app.chromium import chromium, log_in, serving
from tests.conftest import SeededStudy, Users, login

# Seeded once per run; each test that uses the fixture below starts on a copy.
SEEDED_STUDY = SeededStudy("dashboard study", seed=2, fixture="study")


@pytest.fixture
def study(ctx: Context) -> Study:
    with ctx.session() as session:
        return seed_synthetic_study(session, name="dashboard study", seed=2)


@pytest.mark.sqlite_only("who may see the dashboard; its queries run on both in the figure tests")
@pytest.mark.parametrize(
    ("role", "status"),
    [
        (Role.ADMIN, 200),
        (Role.COORDINATOR, 200),
        (Role.ANALYST, 200),
        (Role.GRADER, 403),
        (Role.PARTICIPANT, 403),
    ],
)
def test_dashboard_access(
    client: FlaskClient, users: Users, study: Study, role: Role, status: int
) -> None:
    login(client, users[role].email)
    assert client.get(f"/analysis/?study={study.id}").status_code == status
    assert client.get("/analysis/plotly.min.js").status_code == status


def test_anonymous_is_sent_to_login(client: FlaskClient) -> None:
    response = client.get("/analysis/")
    assert response.status_code == 302 and "/login" in response.headers["Location"]


def test_dashboard_shows_figures_and_crossover(
    client: FlaskClient, users: Users, study: Study
) -> None:
    login(client, users[Role.ANALYST].email)
    page = client.get(f"/analysis/?study={study.id}").get_data(as_text=True)
    for name in ("trajectories", "tasks", "cost", "categories", "stages", "failures", "agreement"):
        assert f'id="fig-{name}"' in page
    assert "SYNTHETIC data" in page
    assert "human overtakes iterative:model-a" in page
    assert 'src="/analysis/plotly.min.js"' in page and "cdn.plot.ly/plotly" not in page
    js = client.get("/analysis/plotly.min.js")
    assert js.mimetype == "application/javascript" and b"Plotly" in js.data[:5000]


@pytest.mark.sqlite_only("the statistics stated on the page; the figures' queries run on both")
def test_dashboard_states_method_sizes_and_paired_difference(
    client: FlaskClient, users: Users, study: Study
) -> None:
    """Issue 13: method, tasks and attempts per group, replicates, paired differences, and
    best-of-k beyond the data named on the figure."""
    from analysis.intervals import METHOD, METHOD_DETAIL

    login(client, users[Role.ANALYST].email)
    page = client.get(f"/analysis/?study={study.id}").get_data(as_text=True)
    assert html.escape(METHOD_DETAIL) in page
    assert "<strong>Replicates:</strong> none for any interval; 500 paired bootstrap" in page
    # 5 tasks in the seeded study; humans have 3 attempts per task, agents 4
    assert "<tr><td>human</td><td>5</td><td>15</td></tr>" in page
    assert "<tr><td>iterative:model-a</td><td>5</td><td>20</td></tr>" in page
    assert "Paired difference, later leader minus early leader" in page
    assert "human \u2212 iterative:model-a" in page and "n=5" in page
    assert "Compared on the 5 tasks both groups attempted (human 15, iterative:model-a 20" in page
    # Who leads at each checkpoint, and the attempts behind each comparison.
    assert "iterative:model-a (20 attempts) vs human (15 attempts)" in page
    assert "human ahead" in page
    captions = page.replace("\\u003cbr\\u003e", " ")  # figure captions, wrapped into lines
    assert f"Intervals: 95%, {METHOD}" in captions
    assert "not shown: beyond the data (" in page and "; human k=4;" in page


def test_filters_narrow_the_figures(client: FlaskClient, users: Users, study: Study) -> None:
    login(client, users[Role.COORDINATOR].email)
    task = f"synthetic-{study.id}-scored-1"
    page = client.get(
        f"/analysis/?study={study.id}&task={task}&group=human&group=basic:model-b&checkpoint=8"
    ).get_data(as_text=True)
    assert "iterative:model-a mean" not in page and "human mean" in page
    assert "Scores by rubric category at 8 working hours" in page
    assert f'value="{task}" selected' in page


@pytest.mark.sqlite_only("the filters' validation, not the storage")
@pytest.mark.parametrize(
    "query",
    [
        "study=abc",
        "study={id}&checkpoint=3",
        "study={id}&checkpoint=soon",
        "study={id}&task=ghost",
        "study={id}&intervals=daily",
    ],
)
def test_bad_filters_are_422(client: FlaskClient, users: Users, study: Study, query: str) -> None:
    login(client, users[Role.ANALYST].email)
    response = client.get("/analysis/?" + query.format(id=study.id))
    assert response.status_code == 422


@pytest.mark.sqlite_only("the filters' validation, not the storage")
@pytest.mark.parametrize("query", ["checkpoint=soon", "intervals=daily"])
def test_a_bad_checkpoint_or_intervals_is_answered_before_the_study_is_read(
    client: FlaskClient, users: Users, study: Study, query: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a large study takes seconds: a request whose filters cannot be right is refused
    without it."""

    def not_read(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the study was read for a request refused anyway")

    monkeypatch.setattr(analysis, "load_study", not_read)
    login(client, users[Role.ANALYST].email)
    assert client.get(f"/analysis/?study={study.id}&{query}").status_code == 422


def test_unknown_study_is_404(client: FlaskClient, users: Users, study: Study) -> None:
    login(client, users[Role.ANALYST].email)
    assert client.get(f"/analysis/?study={study.id + 100}").status_code == 404


def test_no_studies_yet(client: FlaskClient, users: Users) -> None:
    login(client, users[Role.ANALYST].email)
    page = client.get("/analysis/").get_data(as_text=True)
    assert "No studies yet" in page


@pytest.fixture
def live_server(app) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with serving(app) as url:
        yield url


@pytest.mark.browser
@pytest.mark.sqlite_only("the figure in a browser")
def test_dashboard_renders_figure_in_headless_chromium(
    live_server: str, users: Users, study: Study
) -> None:
    """Log in through the real form in Chromium, open the dashboard, wait for plotly's SVG."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as driver:
        log_in(driver, live_server, users[Role.ANALYST].email)
        driver.get(f"{live_server}/analysis/?study={study.id}")
        WebDriverWait(driver, 90).until(
            ec.presence_of_element_located((By.CSS_SELECTOR, "#fig-trajectories .main-svg"))
        )
        traces = driver.execute_script(
            "return document.getElementById('fig-trajectories').data.map(t => t.name);"
        )
        lines = driver.execute_script(
            "return document.querySelectorAll('#fig-trajectories .scatterlayer .trace').length;"
        )
        title = driver.execute_script(
            "return document.querySelector('#fig-trajectories .gtitle').textContent;"
        )
    assert "human mean" in traces and "iterative:model-a mean" in traces
    assert lines >= 6  # attempt lines, bands and means of three groups drawn as SVG
    assert title.startswith("SYNTHETIC")


@pytest.mark.sqlite_only("the figure's intervals and labels")
def test_anytime_intervals_are_offered_and_labelled(
    client: FlaskClient, users: Users, study: Study
) -> None:
    """Issue 37: a study looked at daily gets confidence sequences, labelled as such."""
    from analysis.sequential import CS_DETAIL

    login(client, users[Role.ANALYST].email)
    rubric = f"task=synthetic-{study.id}-paper-1&task=synthetic-{study.id}-paper-2"
    page = client.get(f"/analysis/?study={study.id}&{rubric}&intervals=anytime")
    text = page.get_data(as_text=True)
    assert html.escape(CS_DETAIL) in text
    assert "Intervals of the curves (anytime-valid: this study is looked at while it runs)" in text
    assert '<option value="anytime" selected>' in text
    fixed = client.get(f"/analysis/?study={study.id}&{rubric}&intervals=fixed")
    assert html.escape(CS_DETAIL) not in fixed.get_data(as_text=True)
    # Scored tasks' normalised scores have no upper bound: no sequence, and the page says why.
    mixed = client.get(f"/analysis/?study={study.id}&intervals=anytime").get_data(as_text=True)
    assert html.escape(CS_DETAIL) not in mixed
    assert "Anytime-valid intervals need scores in a known range" in mixed
