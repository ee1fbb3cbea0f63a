"""The study page names each attempt as graders see it (issue 40 item 5): the per-attempt S-
label of the grading queue, not the participant's P- pseudonym, which graders never see."""

from __future__ import annotations

import re

import pytest
from flask.testing import FlaskClient

from baseline.context import Context
from baseline.grading import expert_grading
from baseline.models import Role
from baseline.studies import studies
from baseline.tasks import tasks
from tests.conftest import Users, login

pytestmark = pytest.mark.sqlite_only("the page's columns, not the storage")


def test_the_attempts_table_shows_the_label_graders_see(
    ctx: Context, client: FlaskClient, users: Users
) -> None:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name="Labels"), None)
        task = tasks.import_demo_tasks(session, ctx.settings)[0]
        studies.add_task(session, study, task, None)
        agent = studies.add_agent(session, study, "A", "basic", "m", "", {}, None)
        made = [studies.create_attempt(session, agent, task, None) for _ in range(2)]
        study_id, pseudonym = study.id, agent.pseudonym
        labels = {a.id: expert_grading.blind_label(a) for a in made}
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    table = re.search(r'<table id="attempts">(.*?)</table>', page, re.S)
    assert table and "<th>Graders see</th>" in table.group(1)
    for attempt_id, label in labels.items():
        row = re.search(rf'<tr><td><a href="/attempts/{attempt_id}">.*?</tr>', table.group(1), re.S)
        assert row and f"<code>{label}</code>" in row.group(0) and label.startswith("S-")
        assert pseudonym not in row.group(0)
    assert "Pseudonym (graders see)" not in page
