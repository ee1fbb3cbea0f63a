"""Enrolling a built-in agent configuration with N runs per task: the domain rule, the API, the
coordinator's form and the CLI."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from sqlalchemy import select

from baseline.attempts import attempts
from baseline.context import Context
from baseline.errors import InvalidInput
from baseline.models import Attempt, AuditEvent, Participant, Role, Study
from baseline.people import accounts
from baseline.runs import agent_worker
from baseline.studies import agent_enrolment, studies
from baseline.tasks import tasks
from tests import cli_entry
from tests.baseline.attempt_world import directory_resolver
from tests.conftest import Users, json_of, login

PRICES = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 4.0}


def _study(ctx: Context, name: str = "Agents study") -> int:
    with ctx.session() as session:
        study = studies.create_study(session, studies.StudySpec(name=name), None)
        for task in tasks.import_demo_tasks(session, ctx.settings):
            studies.add_task(session, study, task, None)
        return study.id


def test_enrolment_creates_n_attempts_per_task_in_one_group(ctx: Context) -> None:
    study_id = _study(ctx)
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        enrolment = agent_enrolment.enrol(
            session, study, name="GPT basic", scaffold="basic", model="gpt-x",
            endpoint="http://127.0.0.1:9/v1", settings={**PRICES, "token_limit": 10_000},
            runs_per_task=3, actor_id=None,
        )  # fmt: skip
        made = session.scalars(select(Attempt).where(Attempt.study_id == study_id)).all()
        assert sorted(a.id for a in made) == sorted(enrolment.attempt_ids)
        assert len(made) == 3 * len(study.tasks)
        assert {a.participant.group for a in made} == {"basic:gpt-x"}
        assert enrolment.participant.agent_limits == {**PRICES, "token_limit": 10_000}
        assert session.scalars(
            select(AuditEvent).where(AuditEvent.action == "participant.enrol_agent")
        ).one()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"scaffold": "fancy"}, "scaffold: unknown 'fancy'; known: basic, iterative"),
        ({"settings": {}}, "input_usd_per_mtok: Field required"),
        ({"settings": {**PRICES, "temperature": 9}}, "temperature: Input should be less than"),
        ({"runs_per_task": 0}, "runs_per_task: must be from 1 to 100"),
    ],
)
def test_a_bad_configuration_is_refused_before_anything_is_made(
    ctx: Context, changes: dict[str, object], message: str
) -> None:
    study_id = _study(ctx)
    values: dict[str, object] = {
        "name": "A", "scaffold": "basic", "model": "m", "endpoint": "http://x/v1",
        "settings": PRICES, "runs_per_task": 1, **changes,
    }  # fmt: skip
    with ctx.session() as session:
        study = session.get(Study, study_id)
        assert study is not None
        with pytest.raises(InvalidInput, match=re.escape(message)):
            agent_enrolment.enrol(session, study, actor_id=None, **values)  # type: ignore[arg-type]
    with ctx.session() as session:
        assert session.scalars(select(Participant)).all() == []


def test_api_enrolment(ctx: Context, client: FlaskClient, users: Users) -> None:
    study_id = _study(ctx)
    with ctx.session() as session:
        coordinator = accounts.issue_token(session, session.merge(users[Role.COORDINATOR]), "t")
        grader = accounts.issue_token(session, session.merge(users[Role.GRADER]), "t")
    body = {"name": "Iter", "scaffold": "iterative", "model": "m", "endpoint": "http://x/v1",
            "settings": PRICES, "runs_per_task": 2}  # fmt: skip
    url = f"/api/v1/studies/{study_id}/agent-enrolments"
    made = client.post(url, json=body, headers={"Authorization": f"Bearer {coordinator}"})
    assert made.status_code == 201, made.json
    assert json_of(made)["participant"]["group"] == "iterative:m"
    assert len(json_of(made)["attempt_ids"]) == 4  # two demo tasks, two runs each
    bad = client.post(url, json={**body, "settings": {}},
                      headers={"Authorization": f"Bearer {coordinator}"})  # fmt: skip
    assert bad.status_code == 422 and "input_usd_per_mtok" in json_of(bad)["message"]
    refused = client.post(url, json=body, headers={"Authorization": f"Bearer {grader}"})
    assert refused.status_code == 403


def test_coordinator_form_enrolment(ctx: Context, client: FlaskClient, users: Users) -> None:
    study_id = _study(ctx)
    login(client, users[Role.COORDINATOR].email)
    page = client.get(f"/studies/{study_id}").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token and 'name="runs_per_task"' in page
    form = {"csrf_token": token.group(1), "name": "Form agent", "scaffold": "basic",
            "model": "m", "endpoint": "http://x/v1", "runs_per_task": "2",
            "setting_input_usd_per_mtok": "1", "setting_output_usd_per_mtok": "2"}  # fmt: skip
    done = client.post(f"/studies/{study_id}/agents", data=form, follow_redirects=True)
    assert "Agent enrolled with 4 attempts." in done.get_data(as_text=True)
    broken = client.post(f"/studies/{study_id}/agents",
                         data={**form, "setting_input_usd_per_mtok": "cheap"})  # fmt: skip
    assert broken.status_code == 422
    assert "input_usd_per_mtok: not a number" in broken.get_data(as_text=True)
    with ctx.session() as session:
        assert len(session.scalars(select(Attempt)).all()) == 4


def test_cli_enrolment(tmp_path: Path) -> None:
    from baseline.config import Settings
    from baseline.migrate import upgrade

    db = f"sqlite:///{tmp_path / 'baseline.db'}"
    upgrade(db)
    ctx = Context.from_settings(Settings(home=tmp_path, database_url=db, secret_key="k"))
    _study(ctx, "Cli study")
    ctx.engine.dispose()
    env = cli_entry.home_env(tmp_path)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli_entry.run_here(["agent", *args], env)

    ok = cli("enrol", "--study", "Cli study", "--name", "C", "--scaffold", "basic", "--model",
             "m", "--endpoint", "http://x/v1", "--runs", "2", "--set", "input_usd_per_mtok=1",
             "--set", "output_usd_per_mtok=2", "--set", "generation_counts=false")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert re.match(
        r"enrolled participant \d+ \(basic:m, settings [0-9a-f]{12}\); attempts \d+, \d+, \d+, \d+",
        ok.stdout,
    )
    # An API agent (README: "enrol it with a scaffold that is not built in, e.g. `api`"): its
    # attempts are made, no settings of a built-in loop are asked for, and no worker drives them.
    # (--base-url, the judge commands' spelling, names the endpoint too)
    api = cli("enrol", "--study", "Cli study", "--name", "Remote", "--scaffold", "api",
              "--model", "m", "--base-url", "")  # fmt: skip
    assert api.returncode == 0, api.stderr
    made = re.match(
        r"enrolled participant \d+ \(api:m, settings [0-9a-f]{12}\); attempts (\d+), (\d+)$",
        api.stdout,
    )
    assert made is not None
    ctx = Context.from_settings(Settings(home=tmp_path, database_url=db, secret_key="k"))
    for attempt_id in made.groups():
        attempts.start(ctx, int(attempt_id), None, directory_resolver(tmp_path))
    assert not set(map(int, made.groups())) & set(agent_worker.runnable_attempts(ctx))
    ctx.engine.dispose()
    bad = cli("enrol", "--study", "Cli study", "--name", "D", "--scaffold", "basic", "--model",
              "m", "--endpoint", "http://x/v1", "--set", "oops")  # fmt: skip
    assert bad.returncode == 1 and bad.stderr.strip() == "error: --set 'oops': expected KEY=VALUE"
    missing = cli("transcript", "1")
    assert missing.returncode == 1
    assert missing.stderr.strip() == "error: attempt 1 has no agent transcript"
