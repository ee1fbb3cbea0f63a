"""The study planner in the portal and the API: guesses or a pilot in, tasks and cost out."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from analysis.seed import seed_synthetic_study
from baseline.context import Context
from baseline.models import Role, Study
from baseline.people import accounts
from tests.conftest import SeededStudy, Users, json_of, login

GUESSES = "checkpoints=2:0.10:0.25,8:0.45:0.30&task_sd=1&attempt_sd=0.5&attempts_b=3"


# Seeded once per run; each test that uses the fixture below starts on a copy.
SEEDED_STUDY = SeededStudy("planner pilot", seed=4, fixture="study")


@pytest.fixture
def study(ctx: Context) -> Study:
    with ctx.session() as session:
        return seed_synthetic_study(session, name="planner pilot", seed=4)


def test_the_page_plans_from_stated_guesses(client: FlaskClient, users: Users) -> None:
    login(client, users[Role.ANALYST].email)
    form = client.get("/analysis/plan").get_data(as_text=True)
    assert 'id="plan-form"' in form and "plan-result" not in form
    page = client.get(f"/analysis/plan?run=1&{GUESSES}&studies=500&human_hourly_usd=50")
    text = page.get_data(as_text=True)
    assert page.status_code == 200
    assert "agent against human: power 80% at 95%" in text
    assert "<td>2 h</td><td>+0.15</td>" in text and "<td>8 h</td><td>-0.15</td>" in text
    assert "Participant pay" in text and 'id="fig-power"' in text
    assert "Power to detect the gap" in text  # the figure's title
    index = client.get("/analysis/").get_data(as_text=True)
    assert 'href="/analysis/plan"' in index


def test_the_page_plans_from_a_pilot(client: FlaskClient, users: Users, study: Study) -> None:
    login(client, users[Role.COORDINATOR].email)
    page = client.get(
        f"/analysis/plan?run=1&pilot={study.id}&group_a=human&group_b=iterative:model-a"
        "&checkpoints=8:0:0,32:0:0&studies=300&task_sd=&attempt_sd="
    )
    text = page.get_data(as_text=True)
    assert page.status_code == 200, text[:500]
    assert "iterative:model-a against human" in text
    assert "<td>8 h</td>" in text and "<td>32 h</td>" in text and "<td>2 h</td>" not in text


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (f"{GUESSES}&studies=500&power=1", "power must lie strictly between 0 and 1"),
        ("checkpoints=2:0.2:0.2&task_sd=1&attempt_sd=1", "a gap of 0 cannot be detected"),
        ("checkpoints=soon&task_sd=1&attempt_sd=1", "is not HOURS:MEAN_A:MEAN_B"),
        ("checkpoints=&task_sd=1&attempt_sd=1", "give at least one HOURS:MEAN_A:MEAN_B"),
        (f"{GUESSES}&studies=lots", "studies: not a number"),
        (f"{GUESSES}&studies=500&pilot=abc", "pilot: expected a study id"),
        (f"{GUESSES}&studies=20000&attempts_a=20&attempts_b=20", "scores, over the portal"),
    ],
)
def test_bad_plans_are_422_with_the_reason(
    client: FlaskClient, users: Users, query: str, message: str
) -> None:
    login(client, users[Role.ANALYST].email)
    page = client.get(f"/analysis/plan?run=1&{query}")
    text = page.get_data(as_text=True)
    assert page.status_code == 422 and message in text
    assert 'id="plan-error"' in text and 'id="plan-form"' in text  # the form keeps its values


def test_the_api_plans_and_refuses_bad_plans(
    client: FlaskClient, users: Users, ctx: Context, study: Study
) -> None:
    with ctx.session() as session:
        token = accounts.issue_token(session, session.merge(users[Role.ANALYST]), "plan")
        participant = accounts.issue_token(session, session.merge(users[Role.PARTICIPANT]), "plan")
    auth = {"Authorization": f"Bearer {token}"}
    body = {
        "checkpoints": [{"hours": 4, "mean_a": 0.2, "mean_b": 0.35}],
        "task_sd": 1.0,
        "attempt_sd": 0.5,
        "studies": 500,
        "costs": {"human_hourly_usd": 40},
    }
    response = client.post("/api/v1/plan", json=body, headers=auth)
    assert response.status_code == 200, response.get_data(as_text=True)
    plan = json_of(response)["plan"]
    (checkpoint,) = plan["checkpoints"]
    assert checkpoint["tasks_needed"] >= 3 and checkpoint["power_at_needed"] >= 0.8
    assert plan["budget"]["human_pay_usd"] == plan["budget"]["human_attempts"] * 8 * 40
    piloted = client.post(
        "/api/v1/plan",
        json={"pilot_study_id": study.id, "group_b": "basic:model-b", "studies": 300},
        headers=auth,
    )
    assert piloted.status_code == 200, piloted.get_data(as_text=True)
    assert json_of(piloted)["plan"]["spec"]["group_b"] == "basic:model-b"
    for bad, message in (
        ({**body, "power": 1.0}, "power must lie strictly between 0 and 1"),
        ({**body, "checkpoints": [{"hours": 4, "mean_a": 0.3, "mean_b": 0.3}]}, "gap of 0"),
        ({"checkpoints": body["checkpoints"]}, "task_sd"),
    ):
        refused = client.post("/api/v1/plan", json=bad, headers=auth)
        assert refused.status_code == 422 and message in json_of(refused)["message"], (
            refused.get_data(as_text=True)
        )
    forbidden = client.post(
        "/api/v1/plan", json=body, headers={"Authorization": f"Bearer {participant}"}
    )
    assert forbidden.status_code == 403
