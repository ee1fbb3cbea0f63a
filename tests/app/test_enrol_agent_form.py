"""The enrol-agent form (issue 40 item 5): the scaffold is a choice of those the code defines and
the settings are typed form fields, with a refusal shown on the form, what was typed kept."""

from __future__ import annotations

import re

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select

from agents import scaffold as scaffolds
from agents.model import AgentModelConfig
from agents.settings import AgentSettings
from baseline.context import Context
from baseline.models import Participant, Role
from baseline.studies import studies
from baseline.tasks import tasks
from tests.conftest import Users, login

pytestmark = pytest.mark.sqlite_only("the form's fields and answers, not the storage")


@pytest.fixture
def study_id(ctx: Context) -> int:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Form agents"), None)
        studies.add_task(session, study, tasks.import_demo_tasks(session, ctx.settings)[0], None)
        return study.id


def _page(client: FlaskClient, study_id: int) -> tuple[str, dict[str, str]]:
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token
    form = {"csrf_token": token.group(1), "name": "Typed", "scaffold": "basic", "model": "m",
            "endpoint": "http://x/v1", "runs_per_task": "1"}  # fmt: skip
    return page, form


def test_the_scaffold_is_a_choice_and_every_setting_a_field(
    client: FlaskClient, users: Users, study_id: int
) -> None:
    login(client, users[Role.COORDINATOR].email)
    page, _ = _page(client, study_id)
    menu = re.search(r'<select id="ag-scaffold" name="scaffold">(.*?)</select>', page, re.S)
    assert menu
    offered = re.findall(r'<option value="([^"]+)"', menu.group(1))
    assert offered == [*scaffolds.names(), "command", "api"]
    assert 'name="settings"' not in page
    for name in (set(AgentModelConfig.model_fields) | set(AgentSettings.model_fields)) - {
        "base_url",
        "model",
    }:
        assert f'name="setting_{name}"' in page, name
    assert 'name="setting_command"' in page and 'name="setting_command_env"' in page


def test_typed_fields_become_the_enrolled_settings(
    ctx: Context, client: FlaskClient, users: Users, study_id: int
) -> None:
    login(client, users[Role.COORDINATOR].email)
    _, form = _page(client, study_id)
    fields = {"setting_input_usd_per_mtok": "1.5", "setting_output_usd_per_mtok": "6",
              "setting_generation_counts": "no", "setting_token_limit": "5000",
              "setting_reasoning_effort": "low", "setting_temperature": ""}  # fmt: skip
    done = client.post(f"/studies/{study_id}/agents", data={**form, **fields})
    assert done.status_code == 303, done.get_data(as_text=True)[:2000]
    with ctx.session() as session:
        agent = session.scalars(
            select(Participant).where(Participant.display_name == "Typed")
        ).one()
        assert agent.agent_limits == {
            "input_usd_per_mtok": 1.5, "output_usd_per_mtok": 6.0, "generation_counts": False,
            "token_limit": 5000, "reasoning_effort": "low",
        }  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "input_usd_per_mtok: Field required"),
        ({"setting_input_usd_per_mtok": "cheap"}, "input_usd_per_mtok: not a number"),
        ({"setting_token_limit": "1.5"}, "token_limit: not a number"),
        ({"setting_temperature": "9"}, "temperature: Input should be less than"),
        ({"scaffold": "freeform"}, "scaffold: unknown 'freeform'"),
        ({"setting_command": "my-agent"}, "command: only a command agent has a command"),
        ({"scaffold": "command", "setting_command": "x"}, "command_version: Field required"),
        (
            {
                "scaffold": "command",
                "setting_command": "x",
                "setting_command_version": "1",
                "setting_command_env": "no equals sign",
            },
            "command_env: one NAME=value a line",
        ),
    ],
)
def test_a_refusal_is_shown_on_the_form_with_what_was_typed(
    ctx: Context,
    client: FlaskClient,
    users: Users,
    study_id: int,
    changes: dict[str, str],
    message: str,
) -> None:
    login(client, users[Role.COORDINATOR].email)
    _, form = _page(client, study_id)
    prices = {"setting_input_usd_per_mtok": "1", "setting_output_usd_per_mtok": "2"}
    sent = {**form, **({} if not changes else prices), **changes}
    refused = client.post(f"/studies/{study_id}/agents", data=sent)
    text = refused.get_data(as_text=True)
    assert refused.status_code == 422
    shown = re.search(r'<p class="flash error" id="enrol-error">([^<]*)</p>', text)
    assert shown and message in shown.group(1).replace("&#39;", "'"), text[:3000]
    assert 'id="ag-name" name="name" value="Typed"' in text
    with ctx.session() as session:
        assert session.scalars(select(Participant)).all() == []
